// An AgentRunner for @copilotkit/runtime/v2 that leaves runs, history and cancellation to
// agui-serve instead of keeping them in this process's memory.
//
// - run:     the request's HttpAgent posts RunAgentInput to the daemon; its events are passed
//            through as they arrive. A transport failure becomes a RUN_ERROR event, so the
//            browser sees why the run ended instead of a stream that just stops.
// - connect: GET {base}/threads/{id}/stream. On an idle thread the daemon answers a short
//            hydration run (MESSAGES_SNAPSHOT + STATE_SNAPSHOT), on a live one it replays the
//            run so far and follows it: a page reload mid-run picks the run up where it is;
//            on a run waiting for the page (an approval), it hands over that waiting point.
// - stop:    POST {base}/runs/{runId}/cancel for the thread's live run (its id from
//            GET {base}/threads/{id}), so the run ends for every attached stream.
import { AgentRunner } from "@copilotkit/runtime/v2";
import { EventType, runHttpRequest, transformHttpEventStream } from "@ag-ui/client";
import { Observable } from "rxjs";

export class AguiServeRunner extends AgentRunner {
  /**
   * @param {{ base: string, token: string, fetch?: typeof fetch }} options
   *   base: the daemon's route namespace, e.g. https://127.0.0.1:8443/agui
   */
  constructor({ base, token, fetch: fetchFn = fetch }) {
    super();
    this.base = base.replace(/\/+$/, "");
    this.token = token;
    this.fetch = fetchFn;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.token}`, ...extra };
  }

  threadUrl(threadId, suffix = "") {
    return `${this.base}/threads/${encodeURIComponent(threadId)}${suffix}`;
  }

  run({ agent, input }) {
    return new Observable((subscriber) => {
      let terminal = false;
      const subscription = agent.run(input).subscribe({
        next: (event) => {
          if (isTerminal(event)) terminal = true;
          subscriber.next(event);
        },
        error: (error) => {
          if (!terminal) subscriber.next(runError(error));
          subscriber.complete();
        },
        complete: () => {
          if (!terminal) subscriber.next(runError(new Error("the agent stream ended without a terminal event")));
          subscriber.complete();
        },
      });
      // The browser went away (a reload, a closed tab): the run goes on in the daemon.
      return () => subscription.unsubscribe();
    });
  }

  connect({ threadId }) {
    return new Observable((subscriber) => {
      const abort = new AbortController();
      let subscription;
      this.fetch(this.threadUrl(threadId, "/stream"), {
        headers: this.headers({ Accept: "text/event-stream" }),
        signal: abort.signal,
      })
        .then((response) => {
          // A thread the daemon has never seen: nothing to restore.
          if (response.status === 404) return subscriber.complete();
          subscription = transformHttpEventStream(runHttpRequest(() => Promise.resolve(response))).subscribe(subscriber);
        })
        .catch((error) => {
          if (!abort.signal.aborted) subscriber.error(error);
        });
      return () => {
        abort.abort();
        subscription?.unsubscribe();
      };
    });
  }

  async isRunning({ threadId }) {
    const thread = await this.thread(threadId);
    return thread?.status === "running";
  }

  async stop({ threadId, runId }) {
    // The daemon knows the thread's live run, whichever process or page started it (the
    // browser's own stream may already be gone when its stop request arrives).
    let target = runId;
    if (!target) {
      const thread = await this.thread(threadId);
      if (thread && thread.status !== "idle") target = thread.lastRun?.runId;
    }
    if (!target) return false;
    const response = await this.fetch(`${this.base}/runs/${encodeURIComponent(target)}/cancel`, {
      method: "POST",
      headers: this.headers(),
    });
    return response.status === 202;
  }

  /** The daemon's metadata for a thread, or null when it has none. */
  async thread(threadId) {
    const response = await this.fetch(this.threadUrl(threadId), { headers: this.headers() });
    return response.ok ? response.json() : null;
  }
}

function isTerminal(event) {
  return event.type === EventType.RUN_FINISHED || event.type === EventType.RUN_ERROR;
}

function runError(error) {
  return {
    type: EventType.RUN_ERROR,
    message: error instanceof Error ? error.message : String(error),
    code: "RUNTIME_TRANSPORT",
    timestamp: Date.now(),
  };
}
