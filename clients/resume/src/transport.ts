// The resumable transport: an event stream that, when its connection is cut, reattaches to
// the daemon's thread stream after the last event id it handed on, so that the reader sees
// one uninterrupted stream. It knows SSE framing and the daemon's reattach route; it knows
// nothing of the AG-UI client, which reads what it returns as an ordinary response.
// The state machine is described in docs/resume.md.

/** The `fetch` an `HttpAgent` calls: `(url, init) => Promise<Response>`. */
export type FetchFn = (url: string, init: RequestInit) => Promise<Response>;

/** A frame handed to the client: its SSE id (absent on a frame this package made) and data. */
export interface ResumeFrame {
  id?: string;
  data: string;
}

export interface ResumeOptions {
  /**
   * Reattach attempts in a row that bring no new event before the stream ends with a
   * `RUN_ERROR` whose code is `STREAM_LOST`. Default 8.
   */
  maxAttempts?: number;
  /** Delay before the first reattach, in ms; doubled per failed attempt. Default 250. */
  initialDelayMs?: number;
  /** Upper bound of the delay between attempts, in ms. Default 5000. */
  maxDelayMs?: number;
  /**
   * A stream that brings nothing, not even a keep-alive, for this long (ms) is taken as
   * cut. Default 45000 (three of the daemon's default keep-alive intervals); 0: never.
   */
  idleTimeoutMs?: number;
  /**
   * The daemon answered a reattach with `agui-resume: resync`: it cannot replay exactly
   * what the client missed. `"restate"` (default): the partial view ends with a
   * `RUN_ERROR` whose code is `STREAM_RESYNC`, and the daemon's restatement of the run
   * (snapshots, the open message so far, then live) follows. `"fail"`: the stream ends
   * with that `RUN_ERROR`.
   */
  onResync?: "restate" | "fail";
  /**
   * The daemon's route namespace, e.g. `https://127.0.0.1:8443/agui`. Default: the agent
   * URL less its last segment (`.../agui/demo`), or less `agent/NAME/run`.
   */
  baseUrl?: string;
  /** Called with every frame handed to the client, in order (e.g. to keep the last id). */
  onFrame?: (frame: ResumeFrame) => void;
}

/** The `code` of the `RUN_ERROR` that ends a partial view when the daemon cannot replay it. */
export const RESYNC_CODE = "STREAM_RESYNC";
/** The `code` of the `RUN_ERROR` that ends a stream that could not be taken up again. */
export const LOST_CODE = "STREAM_LOST";

/** A connection that brought nothing for the idle timeout. */
class IdleError extends Error {}

const TERMINAL = new Set(["RUN_FINISHED", "RUN_ERROR"]);
const RETRYABLE = new Set([408, 425, 429, 500, 502, 503, 504]);
const encoder = new TextEncoder();

interface Frame {
  text: string;
  id?: string;
  data?: string;
}

export class ResumableTransport {
  private readonly inner: FetchFn;
  private readonly options: ResumeOptions;
  private readonly baseUrl: string;
  private readonly query: string;

  constructor(inner: FetchFn, agentUrl: string, options: ResumeOptions = {}) {
    this.inner = inner;
    this.options = options;
    const base = new URL(options.baseUrl ?? namespaceOf(agentUrl));
    // A token given as `?token=` on the agent URL goes to the stream route as well.
    this.query = options.baseUrl ? "" : new URL(agentUrl).search;
    this.baseUrl = `${base.origin}${base.pathname.replace(/\/+$/, "")}`;
  }

  /**
   * The agent's `fetch`: a run whose answer is an event stream comes back as a stream that
   * reattaches when cut. Anything else (an error status, another content type, a body
   * without `threadId`) is returned as it came.
   */
  readonly fetch: FetchFn = async (url, init) => {
    const response = await this.inner(url, init);
    const threadId = threadIdOf(init.body);
    if (threadId === undefined || !response.ok || !isEventStream(response) || !response.body)
      return response;
    return this.resumable(response, threadId, init);
  };

  /**
   * The thread's stream (`GET {path}/threads/{id}/stream`): the live run as the daemon
   * restates it, then live; or, with nothing live, the thread as a short finished run. A
   * thread the daemon does not know (404) is an empty stream.
   */
  async attach(threadId: string, headers: Record<string, string>, signal?: AbortSignal) {
    const init: RequestInit = {
      method: "GET",
      headers: { ...headers, Accept: "text/event-stream" },
      signal,
    };
    const response = await this.inner(this.streamUrl(threadId), init);
    if (response.status === 404) {
      await response.body?.cancel().catch(() => {});
      return new Response("", { status: 200, headers: { "content-type": "text/event-stream" } });
    }
    if (!response.ok || !isEventStream(response) || !response.body) return response;
    return this.resumable(response, threadId, init);
  }

  private streamUrl(threadId: string): string {
    return `${this.baseUrl}/threads/${encodeURIComponent(threadId)}/stream${this.query}`;
  }

  private resumable(first: Response, threadId: string, init: RequestInit): Response {
    const stop = new AbortController();
    const outer = init.signal ?? undefined;
    const onAbort = () => stop.abort(outer?.reason);
    if (outer?.aborted) onAbort();
    else outer?.addEventListener("abort", onAbort, { once: true });
    const chunks = this.frames(first, threadId, init, stop.signal);
    const body = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        try {
          const next = await chunks.next();
          if (next.done) {
            outer?.removeEventListener("abort", onAbort);
            controller.close();
          } else controller.enqueue(next.value);
        } catch (error) {
          outer?.removeEventListener("abort", onAbort);
          controller.error(error);
        }
      },
      cancel: async () => {
        outer?.removeEventListener("abort", onAbort);
        stop.abort();
        await chunks.return(undefined).catch(() => {});
      },
    });
    return new Response(body, {
      status: first.status,
      statusText: first.statusText,
      headers: new Headers(first.headers),
    });
  }

  /** The state machine: deliver frames, reattach after the last id when cut. */
  private async *frames(
    first: Response,
    threadId: string,
    init: RequestInit,
    stop: AbortSignal,
  ): AsyncGenerator<Uint8Array> {
    const maxAttempts = this.options.maxAttempts ?? 8;
    let response: Response | undefined = first;
    // The last id handed on, and how many frames in a row carried it: the daemon gives
    // every frame of a restatement (a preamble) its position's id, so a cut after one of
    // them cannot tell whether the rest of it was missed.
    let lastId: string | undefined;
    let sameId = 0;
    // Events handed on since the start or since the last restatement's RUN_ERROR.
    let delivered = false;
    let ended = false;
    let failures = 0;
    let restate = false;
    // A restatement's RUN_ERROR has been handed on (and maybe nothing since).
    let restated = false;
    let lost = "";
    for (;;) {
      if (response) {
        if (restate) {
          restate = false;
          if (delivered) {
            delivered = false;
            restated = true;
            yield this.handOn({ data: JSON.stringify(resyncError(lastId)) });
          }
          lastId = undefined;
          sameId = 0;
        }
        const idleMs = this.options.idleTimeoutMs ?? 45_000;
        try {
          for await (const frame of readFrames(response.body!, stop, idleMs)) {
            if (frame.data === undefined) {
              yield encoder.encode(`${frame.text}\n\n`);
              continue;
            }
            if (frame.id !== undefined) {
              sameId = frame.id === lastId ? sameId + 1 : 1;
              lastId = frame.id;
            }
            delivered = true;
            failures = 0;
            ended = TERMINAL.has(typeOf(frame.data));
            yield this.handOn({ id: frame.id, data: frame.data }, frame.text);
          }
        } catch (error) {
          if (stop.aborted) throw error;
        }
        // The run's terminal event is out: whatever ends the connection now ends the stream.
        if (ended) return;
        response = undefined;
      }
      if (stop.aborted) throw stop.reason;
      if (failures >= maxAttempts) {
        lost = `the stream was cut and ${failures} reattach attempts brought nothing`;
        break;
      }
      await sleep(this.delay(failures), stop);
      failures += 1;
      // A run of frames with one id may have been cut short: start over without an id and
      // take what comes as a restatement.
      const exact = lastId !== undefined && sameId === 1;
      const headers = reattachHeaders(init.headers, exact ? lastId : undefined);
      let answer: Response;
      try {
        answer = await this.inner(this.streamUrl(threadId), { method: "GET", headers, signal: stop });
      } catch (error) {
        if (stop.aborted) throw error;
        continue;
      }
      if (!answer.ok || !isEventStream(answer) || !answer.body) {
        await answer.body?.cancel().catch(() => {});
        if (RETRYABLE.has(answer.status)) {
          await sleep(retryAfterMs(answer), stop);
          continue;
        }
        lost = `the stream was cut and its reattach answered HTTP ${answer.status}`;
        break;
      }
      const resync = !exact || answer.headers.get("agui-resume") === "resync";
      if (resync && delivered && this.options.onResync === "fail") {
        await answer.body.cancel().catch(() => {});
        yield this.handOn({ data: JSON.stringify(resyncError(lastId)) });
        return;
      }
      restate = resync;
      response = answer;
    }
    // Given up: the run ends as a failed run does on the wire, unless the last thing handed
    // on already ended it (a restatement's RUN_ERROR that nothing followed).
    if (delivered || !restated)
      yield this.handOn({ data: JSON.stringify({ type: "RUN_ERROR", message: lost, code: LOST_CODE }) });
  }

  private handOn(frame: ResumeFrame, text?: string): Uint8Array {
    this.options.onFrame?.(frame);
    return encoder.encode(`${text ?? `data: ${frame.data}`}\n\n`);
  }

  private delay(failures: number): number {
    const initial = this.options.initialDelayMs ?? 250;
    const max = this.options.maxDelayMs ?? 5000;
    const full = Math.min(max, initial * 2 ** failures);
    return full / 2 + Math.random() * (full / 2);
  }
}

/** `.../agui/demo` -> `.../agui`; `.../agui/agent/demo/run` -> `.../agui`. */
function namespaceOf(agentUrl: string): string {
  const url = new URL(agentUrl);
  const segments = url.pathname.replace(/\/+$/, "").split("/");
  const [agent, , run] = segments.slice(-3);
  const drop = segments.length >= 4 && agent === "agent" && run === "run" ? 3 : 1;
  url.pathname = segments.slice(0, segments.length - drop).join("/");
  url.search = "";
  return url.toString();
}

function threadIdOf(body: RequestInit["body"]): string | undefined {
  if (typeof body !== "string") return undefined;
  try {
    const threadId = (JSON.parse(body) as { threadId?: unknown }).threadId;
    return typeof threadId === "string" ? threadId : undefined;
  } catch {
    return undefined;
  }
}

function isEventStream(response: Response): boolean {
  const type = response.headers.get("content-type") ?? "";
  return type.split(";")[0].trim().toLowerCase() === "text/event-stream";
}

function typeOf(data: string): string {
  try {
    const type = (JSON.parse(data) as { type?: unknown }).type;
    return typeof type === "string" ? type : "";
  } catch {
    return "";
  }
}

function resyncError(lastId: string | undefined) {
  return {
    type: "RUN_ERROR",
    message:
      `the stream was cut${lastId ? ` after event ${lastId}` : ""} and could not be replayed ` +
      "exactly; the run is restated from here",
    code: RESYNC_CODE,
  };
}

/** The run request's headers, for a GET of the stream route after `lastId`. */
function reattachHeaders(
  headers: RequestInit["headers"],
  lastId: string | undefined,
): Record<string, string> {
  const out: Record<string, string> = {};
  new Headers(headers).forEach((value, name) => {
    if (name !== "content-type" && name !== "content-length") out[name] = value;
  });
  out["accept"] = "text/event-stream";
  if (lastId !== undefined) out["last-event-id"] = lastId;
  return out;
}

function retryAfterMs(response: Response): number {
  const seconds = Number(response.headers.get("retry-after"));
  return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds, 60) * 1000 : 0;
}

function sleep(ms: number, stop: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (stop.aborted) return reject(stop.reason);
    const timer = setTimeout(() => {
      stop.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(stop.reason);
    };
    stop.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The complete frames of an SSE body (split on a blank line; the daemon frames with LF
 * only). A frame cut short by the end of the connection is dropped, never handed on. A
 * body that brings nothing for `idleMs` ends as if cut.
 */
async function* readFrames(
  body: ReadableStream<Uint8Array>,
  stop: AbortSignal,
  idleMs: number,
): AsyncGenerator<Frame> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const onStop = () => void reader.cancel().catch(() => {});
  stop.addEventListener("abort", onStop, { once: true });
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await readWithin(reader, idleMs);
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end: number;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const text = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        yield parseFrame(text);
      }
    }
  } finally {
    stop.removeEventListener("abort", onStop);
    reader.cancel().catch(() => {});
  }
}

async function readWithin(reader: ReadableStreamDefaultReader<Uint8Array>, idleMs: number) {
  if (!(idleMs > 0)) return reader.read();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const idle = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new IdleError(`nothing received for ${idleMs} ms`)), idleMs);
  });
  try {
    return await Promise.race([reader.read(), idle]);
  } finally {
    clearTimeout(timer);
  }
}

function parseFrame(text: string): Frame {
  const frame: Frame = { text };
  const data: string[] = [];
  for (const line of text.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") frame.id = value;
    else if (field === "data") data.push(value);
  }
  if (data.length > 0) frame.data = data.join("\n");
  return frame;
}
