// ResumableHttpAgent: the official AG-UI HttpAgent, with `connect()` (attach to a thread's
// live or last run) and runs whose cut stream is taken up again after its last event id.
// It changes the agent's transport (`fetch`) and nothing else: requests, parsing,
// verification and the subscriber callbacks are the official client's own.

import { HttpAgent, runHttpRequest, transformHttpEventStream } from "@ag-ui/client";
import { ResumableTransport, type ResumeOptions } from "./transport.js";

export { ResumableTransport, RESYNC_CODE, LOST_CODE } from "./transport.js";
export type { FetchFn, ResumeFrame, ResumeOptions } from "./transport.js";

type HttpAgentConfig = ConstructorParameters<typeof HttpAgent>[0];
type RunAgentInput = Parameters<HttpAgent["run"]>[0];
type EventStream = ReturnType<HttpAgent["run"]>;
type RunParameters = Parameters<HttpAgent["runAgent"]>[0];
type Subscriber = Parameters<HttpAgent["runAgent"]>[1];

export interface ResumableHttpAgentConfig extends HttpAgentConfig {
  /** How cut streams are taken up again; every field has a default. */
  resume?: ResumeOptions;
}

/**
 * An `HttpAgent` for agui-serve (or any server with its reattach route): pass it where an
 * `HttpAgent` goes (a CopilotKit agent, `runAgent`, `connectAgent`). A `fetch` of your own
 * goes in the config, as for `HttpAgent`; it carries every request, reattaches included.
 */
export class ResumableHttpAgent extends HttpAgent {
  /** The transport runs and `connect()` go through. */
  readonly transport: ResumableTransport;

  constructor(config: ResumableHttpAgentConfig) {
    super(config);
    this.transport = new ResumableTransport(this.fetch, config.url, config.resume);
    this.fetch = this.transport.fetch;
  }

  /** Like `runAgent`, a fresh abort controller per call, so `abortRun()` stops a connect. */
  override connectAgent(parameters?: RunParameters, subscriber?: Subscriber) {
    this.abortController = parameters?.abortController ?? new AbortController();
    return super.connectAgent(parameters, subscriber);
  }

  /**
   * The thread's stream: a live run restated (snapshots, the open message so far) then
   * live to its end; else the thread as a short finished run; an unknown thread, nothing.
   */
  protected override connect(input: RunAgentInput): EventStream {
    return transformHttpEventStream(
      runHttpRequest(() =>
        this.transport.attach(input.threadId, this.headers, this.abortController.signal),
      ),
      this.debugLogger,
    );
  }

  override clone(): ResumableHttpAgent {
    const cloned = super.clone() as ResumableHttpAgent;
    (cloned as { transport: ResumableTransport }).transport = this.transport;
    return cloned;
  }
}
