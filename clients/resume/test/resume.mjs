// The resumable client against a running agui-serve, with one official @ag-ui/client
// version (chosen by AGUI_CLIENT through client.mjs). A TCP proxy in front of the daemon
// cuts connections after a given number of bytes; runs and connects through it must reach
// the subscriber whole: every event once, in order, with the ids the daemon journaled.
//
// Usage (scripts/resume.sh runs it): AGUI_URL=http://127.0.0.1:PORT/agui AGUI_TOKEN=...
//   AGUI_CLIENT=1.0.0|0.0.59 node --import ./test/client.mjs test/resume.mjs
// The daemon runs with a long --disconnect-grace, so a finished run's frames are still
// journaled when the test reads them back.

import { HttpAgent } from "@ag-ui/client";
import { ResumableHttpAgent, LOST_CODE, RESYNC_CODE } from "../dist/index.js";
import { readFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";
import path from "node:path";

const base = process.env.AGUI_URL;
const token = process.env.AGUI_TOKEN;
const version = process.env.AGUI_CLIENT;
if (!base || !token) {
  console.error("AGUI_URL and AGUI_TOKEN are required");
  process.exit(2);
}
const headers = { Authorization: `Bearer ${token}` };

// The client the hook loaded is the one asked for.
const loaded = JSON.parse(
  readFileSync(path.join(path.dirname(fileURLToPath(import.meta.resolve("@ag-ui/client"))), "..", "package.json"), "utf8"),
).version;
if (loaded !== version) {
  console.error(`asked for @ag-ui/client ${version}, loaded ${loaded}`);
  process.exit(2);
}

// Any warning or error a client logs, and any promise it leaves rejected, fails the case it
// happens in (unless the case expects them: the plain HttpAgent on a cut stream).
const logged = [];
let quiet = false; // the case expects them: kept, not printed
process.on("unhandledRejection", (reason) => logged.push(`unhandled rejection: ${reason}`));
for (const level of ["warn", "error"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    logged.push(`${level}: ${args.map(String).join(" ")}`);
    if (!quiet) original(...args);
  };
}

// Resume quickly: the test waits on events, never on the clock.
const quick = { initialDelayMs: 10, maxDelayMs: 100 };

function user(text) {
  return { id: randomUUID(), role: "user", content: text };
}

async function run(agent, runId = randomUUID(), onEvent = () => {}) {
  const events = [];
  let failure = null;
  try {
    await agent.runAgent(
      { runId },
      {
        onEvent({ event }) {
          events.push(event);
          onEvent(event);
        },
      },
    );
  } catch (error) {
    failure = error;
  }
  return { events, failure, runId };
}

async function connect(agent) {
  const events = [];
  let failure = null;
  try {
    await agent.connectAgent({}, { onEvent: ({ event }) => events.push(event) });
  } catch (error) {
    failure = error;
  }
  return { events, failure };
}

function text(events) {
  return events
    .filter((e) => e.type === "TEXT_MESSAGE_CONTENT")
    .map((e) => e.delta)
    .join("");
}

function lastText(agent) {
  const last = agent.messages[agent.messages.length - 1];
  return last && last.role === "assistant" ? last.content : undefined;
}

// Events with their per-run values (thread, run, message and call ids, timestamps) made
// comparable across threads: each id becomes its kind and the order it was first seen in.
const ID_KEYS = new Set(["threadId", "runId", "messageId", "toolCallId", "parentMessageId", "id"]);
function normalize(events) {
  const seen = new Map();
  const label = (key, value) => {
    if (!seen.has(value)) seen.set(value, `${key}#${seen.size}`);
    return seen.get(value);
  };
  const walk = (value) => {
    if (Array.isArray(value)) return value.map(walk);
    if (value === null || typeof value !== "object") return value;
    return Object.fromEntries(
      Object.entries(value)
        .filter(([key]) => key !== "timestamp")
        .map(([key, v]) => [key, ID_KEYS.has(key) && typeof v === "string" ? label(key, v) : walk(v)]),
    );
  };
  return events.map(walk);
}

// The frames of an SSE body: `{id, data}`.
function parseFrames(body) {
  return body
    .split("\n\n")
    .filter((frame) => frame.split("\n").some((line) => line.startsWith("data:")))
    .map((frame) => {
      const lines = frame.split("\n");
      const id = lines.find((l) => l.startsWith("id:"));
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
      return { id: id ? id.slice(3).replace(/^ /, "") : undefined, data: data.join("\n") };
    });
}

// The daemon's own record of a thread's frames after `lastEventId`, read directly (no
// proxy): an exact replay to the run's end.
async function journaled(threadId, lastEventId) {
  const response = await fetch(`${base}/threads/${encodeURIComponent(threadId)}/stream`, {
    headers: { ...headers, Accept: "text/event-stream", "Last-Event-ID": lastEventId },
  });
  const resume = response.headers.get("agui-resume");
  if (response.status !== 200 || resume !== "exact") throw new Error(`replay: ${response.status} ${resume}`);
  return parseFrames(await response.text());
}

// A TCP proxy in front of the daemon: its first connections are each cut (the rest of the
// response dropped, the connection closed) after the number of response bytes `budgets`
// gives, in order; later connections pass whole. With `forget`, the `Last-Event-ID` of
// every request is replaced by one the daemon cannot honour, so that it resyncs.
async function cuttingProxy(budgets, { forget = false } = {}) {
  const target = new URL(base);
  const plan = [...budgets];
  const stats = { connections: 0, cuts: 0, forgotten: 0 };
  const sockets = new Set();
  const server = net.createServer((client) => {
    stats.connections += 1;
    const budget = plan.shift();
    const upstream = net.connect(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    let sent = 0;
    let cut = false;
    client.on("data", (chunk) => {
      if (!forget) return void upstream.write(chunk);
      const request = chunk.toString("latin1");
      const rewritten = request.replace(/^(last-event-id:)[^\r]*/im, "$1 forgotten");
      if (rewritten !== request) stats.forgotten += 1;
      upstream.write(Buffer.from(rewritten, "latin1"));
    });
    client.on("end", () => upstream.end());
    upstream.on("data", (chunk) => {
      if (cut) return;
      if (budget === undefined || sent + chunk.length < budget) {
        sent += chunk.length;
        client.write(chunk);
        return;
      }
      cut = true;
      stats.cuts += 1;
      client.end(chunk.subarray(0, budget - sent));
      upstream.destroy();
    });
    upstream.on("end", () => client.end());
    upstream.on("close", () => client.end());
    client.on("close", () => upstream.destroy());
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}${target.pathname}`,
    stats,
    close() {
      server.close();
      for (const s of sockets) s.destroy();
    },
  };
}

function resumable(url, threadId, messages, resume = {}) {
  return new ResumableHttpAgent({
    url: `${url}/demo`,
    headers,
    threadId,
    initialMessages: messages,
    resume: { ...quick, ...resume },
  });
}

function plain(url, threadId, messages) {
  return new HttpAgent({ url: `${url}/demo`, headers, threadId, initialMessages: messages });
}

const SLOW = "/slow 30 5";
let reference = null;
async function referenceRun() {
  if (!reference) reference = await run(plain(base, randomUUID(), [user(SLOW)]));
  return reference;
}

// A thread whose run finished through the cuts, for the connect cases.
let finishedThread = null;

const cases = [
  {
    name: "a run cut three times arrives whole: each event once and in order, ids and bytes as the daemon journaled them",
    async run() {
      const ref = await referenceRun();
      if (ref.failure) return `reference run failed: ${ref.failure.message}`;
      const proxy = await cuttingProxy([900, 1300, 1700]);
      try {
        const threadId = randomUUID();
        const frames = [];
        const agent = resumable(proxy.url, threadId, [user(SLOW)], { onFrame: (f) => frames.push(f) });
        const r = await run(agent);
        if (r.failure) return `run failed: ${r.failure.message}`;
        if (proxy.stats.cuts !== 3) return `${proxy.stats.cuts} cuts, not 3`;
        if (!isDeepStrictEqual(normalize(r.events), normalize(ref.events)))
          return `events differ from the uncut run's: ${JSON.stringify(r.events.map((e) => e.type))}`;
        if (frames.length !== r.events.length) return `${frames.length} frames for ${r.events.length} events`;
        // The subscriber saw each frame's event as it was sent.
        for (const [i, frame] of frames.entries()) {
          if (!isDeepStrictEqual(JSON.parse(frame.data), r.events[i]))
            return `frame ${i} ${frame.data} is the event ${JSON.stringify(r.events[i])}`;
        }
        const rest = await journaled(threadId, frames[0].id);
        if (!isDeepStrictEqual(frames.slice(1), rest))
          return `frames differ from the daemon's journal: ${frames.length - 1} vs ${rest.length}`;
        if (new Set(frames.map((f) => f.id)).size !== frames.length) return "an id repeated";
        if (lastText(agent) !== text(ref.events)) return `transcript ${JSON.stringify(lastText(agent))}`;
        finishedThread = { threadId, messages: agent.messages, state: agent.state };
      } finally {
        proxy.close();
      }
    },
  },
  {
    name: "self-check: without resume the same cut loses events (the plain HttpAgent; maxAttempts 0 ends in RUN_ERROR)",
    // The official client reports the cut (1.0.0 logs it, both leave a rejected promise).
    clientErrors: true,
    async run() {
      const ref = await referenceRun();
      const proxy = await cuttingProxy([900, 900]);
      try {
        const r = await run(plain(proxy.url, randomUUID(), [user(SLOW)]));
        if (proxy.stats.cuts !== 1) return `${proxy.stats.cuts} cuts, not 1`;
        if (isDeepStrictEqual(normalize(r.events), normalize(ref.events))) return "the cut run looks whole";
        const none = await run(resumable(proxy.url, randomUUID(), [user(SLOW)], { maxAttempts: 0 }));
        if (proxy.stats.cuts !== 2) return `${proxy.stats.cuts} cuts, not 2`;
        if (none.failure) return `maxAttempts 0: run failed: ${none.failure.message}`;
        const last = none.events[none.events.length - 1];
        if (last?.type !== "RUN_ERROR" || last.code !== LOST_CODE) return `maxAttempts 0: ended ${JSON.stringify(last)}`;
      } finally {
        proxy.close();
      }
      // The run that failed on the client goes on in the daemon; it is left to finish.
    },
  },
  {
    name: "a reattach the daemon cannot honour is restated: RUN_ERROR STREAM_RESYNC, the run again from snapshots, the reply whole",
    async run() {
      const ref = await referenceRun();
      const proxy = await cuttingProxy([900], { forget: true });
      try {
        const threadId = randomUUID();
        const agent = resumable(proxy.url, threadId, [user(SLOW)]);
        const r = await run(agent);
        if (r.failure) return `run failed: ${r.failure.message}`;
        if (proxy.stats.cuts !== 1 || proxy.stats.forgotten !== 1)
          return `${proxy.stats.cuts} cuts, ${proxy.stats.forgotten} ids forgotten, not 1 and 1`;
        const types = r.events.map((e) => e.type);
        const at = types.indexOf("RUN_ERROR");
        if (at < 0 || r.events[at].code !== RESYNC_CODE || types.lastIndexOf("RUN_ERROR") !== at)
          return `events ${types.join(",")}`;
        const again = r.events.slice(at + 1, at + 4).map((e) => e.type).join(",");
        if (again !== "RUN_STARTED,MESSAGES_SNAPSHOT,STATE_SNAPSHOT") return `restated as ${again}`;
        if (r.events[at + 1].runId !== r.events[0].runId) return "restated another run";
        if (types[types.length - 1] !== "RUN_FINISHED") return `ended ${types[types.length - 1]}`;
        if (lastText(agent) !== text(ref.events)) return `transcript ${JSON.stringify(lastText(agent))}`;
        const response = await fetch(`${base}/threads/${threadId}/messages`, { headers });
        const { messages } = await response.json();
        const view = (list) => list.map((m) => [m.id, m.role, m.content]);
        if (!isDeepStrictEqual(view(agent.messages), view(messages)))
          return `client transcript ${JSON.stringify(view(agent.messages))} vs the daemon's ${JSON.stringify(view(messages))}`;
      } finally {
        proxy.close();
      }
    },
  },
  {
    name: "connect() to a live run: restated, then live to its end through two cuts, each event once",
    async run() {
      const threadId = randomUUID();
      const message = user("/slow 150 10");
      const starter = plain(base, threadId, [message]);
      let chunks = 0;
      let third;
      const started = new Promise((resolve) => (third = resolve));
      const live = run(starter, randomUUID(), (event) => {
        if (event.type === "TEXT_MESSAGE_CONTENT" && ++chunks === 3) third();
      });
      await started;
      const proxy = await cuttingProxy([2500, 1500]);
      try {
        const frames = [];
        const agent = resumable(proxy.url, threadId, [], { onFrame: (f) => frames.push(f) });
        const c = await connect(agent);
        const first = await live;
        if (first.failure) return `the run failed: ${first.failure.message}`;
        if (c.failure) return `connect failed: ${c.failure.message}`;
        if (proxy.stats.cuts !== 2) return `${proxy.stats.cuts} cuts, not 2`;
        const types = c.events.map((e) => e.type);
        if (types[0] !== "RUN_STARTED" || c.events[0].runId !== first.runId) return `began ${JSON.stringify(c.events[0])}`;
        if (types.includes("RUN_ERROR")) return `a RUN_ERROR: ${JSON.stringify(c.events.find((e) => e.type === "RUN_ERROR"))}`;
        if (types[types.length - 1] !== "RUN_FINISHED") return `ended ${types[types.length - 1]}`;
        const whole = lastText(starter);
        if (lastText(agent) !== whole || whole.split("\n").filter(Boolean).length !== 150)
          return `connected transcript ${JSON.stringify(lastText(agent))} vs ${JSON.stringify(whole)}`;
        // After the restatement (its frames share one id): the frames the daemon journaled
        // after that id, ids and bytes, each once.
        const after = frames.filter((f) => f.id !== frames[0].id);
        const rest = await journaled(threadId, frames[0].id);
        if (!isDeepStrictEqual(after, rest))
          return `frames after the restatement differ from the daemon's journal: ${after.length} vs ${rest.length}`;
      } finally {
        proxy.close();
      }
    },
  },
  {
    name: "connect() to a finished thread: its transcript and state, as a short finished run",
    async run() {
      if (!finishedThread) return "no finished thread (the first case failed)";
      const agent = resumable(base, finishedThread.threadId, []);
      const c = await connect(agent);
      if (c.failure) return `connect failed: ${c.failure.message}`;
      const types = c.events.map((e) => e.type).join(",");
      if (types !== "RUN_STARTED,MESSAGES_SNAPSHOT,STATE_SNAPSHOT,RUN_FINISHED") return `events ${types}`;
      if (!isDeepStrictEqual(agent.messages, finishedThread.messages))
        return `messages ${JSON.stringify(agent.messages)} vs ${JSON.stringify(finishedThread.messages)}`;
      if (!isDeepStrictEqual(agent.state, finishedThread.state)) return `state ${JSON.stringify(agent.state)}`;
    },
  },
  {
    name: "connect() to a thread the daemon does not know: no events, no error",
    async run() {
      const c = await connect(resumable(base, randomUUID(), []));
      if (c.failure) return `connect failed: ${c.failure.message}`;
      if (c.events.length) return `events ${JSON.stringify(c.events)}`;
    },
  },
  {
    name: "agui-resume: resync: the partial view ends with RUN_ERROR STREAM_RESYNC, the restated run follows; onResync fail fails",
    async run() {
      return await resyncCase();
    },
  },
  {
    name: "a connection that goes silent (no frame, no keep-alive) is taken as cut after idleTimeoutMs and reattached exactly",
    async run() {
      return await silentCase();
    },
  },
];

// A run whose connection stays open but brings nothing after its first frame (a half-open
// connection), against a scripted server that never ends it.
async function silentCase() {
  const frame = (id, event) => `id: ${id}\ndata: ${JSON.stringify(event)}\n\n`;
  const asked = [];
  const held = [];
  let giveUp;
  let endedByServer = false;
  const server = http.createServer((req, res) => {
    req.resume();
    asked.push(`${req.method} ${req.headers["last-event-id"] ?? "-"}`);
    res.writeHead(200, { "content-type": "text/event-stream", "agui-resume": "exact" });
    if (req.method === "POST") {
      res.write(frame("s-1", { type: "RUN_STARTED", threadId: "t", runId: "r" }));
      held.push(res); // and nothing more, unless the client never gives up on it:
      // then the connection ends, so that the case fails instead of hanging.
      giveUp = setTimeout(() => {
        endedByServer = true;
        res.end();
      }, 10_000);
    } else {
      clearTimeout(giveUp);
      res.end(
        frame("s-2", { type: "TEXT_MESSAGE_START", messageId: "m", role: "assistant" }) +
          frame("s-3", { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: "late" }) +
          frame("s-4", { type: "TEXT_MESSAGE_END", messageId: "m" }) +
          frame("s-5", { type: "RUN_FINISHED", threadId: "t", runId: "r" }),
      );
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const agent = new ResumableHttpAgent({
      url: `http://127.0.0.1:${server.address().port}/agui/demo`,
      threadId: "t",
      initialMessages: [user("hi")],
      resume: { ...quick, idleTimeoutMs: 50 },
    });
    const r = await run(agent, "r");
    if (endedByServer) return "the silent connection was never taken as cut";
    if (r.failure) return `run failed: ${r.failure.message}`;
    if (!isDeepStrictEqual(asked, ["POST -", "GET s-1"])) return `requests ${JSON.stringify(asked)}`;
    const types = r.events.map((e) => e.type).join(",");
    if (types !== "RUN_STARTED,TEXT_MESSAGE_START,TEXT_MESSAGE_CONTENT,TEXT_MESSAGE_END,RUN_FINISHED")
      return `events ${types}`;
    if (lastText(agent) !== "late") return `transcript ${JSON.stringify(agent.messages)}`;
  } finally {
    clearTimeout(giveUp);
    for (const res of held) res.destroy();
    server.close();
  }
}

// A cut inside a restatement, and `onResync: "fail"`, against a scripted server: each of
// its answers (resync, a restatement cut after two frames) is fixed, not left to timing.
async function resyncCase() {
  const frame = (id, event) => `${id ? `id: ${id}\n` : ""}data: ${JSON.stringify(event)}\n\n`;
  const started = { type: "RUN_STARTED", threadId: "t", runId: "r" };
  const said = { id: "u", role: "user", content: "hi" };
  const restatement = (id, sofar) => [
    frame(id, started),
    frame(id, { type: "MESSAGES_SNAPSHOT", messages: [said] }),
    frame(id, { type: "STATE_SNAPSHOT", snapshot: { n: 1 } }),
    frame(id, { type: "TEXT_MESSAGE_START", messageId: "m", role: "assistant" }),
    frame(id, { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: sofar }),
  ];
  const rest = [
    frame("e-7", { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: "c" }),
    frame("e-8", { type: "TEXT_MESSAGE_END", messageId: "m" }),
    frame("e-9", { type: "RUN_FINISHED", threadId: "t", runId: "r" }),
  ];
  const asked = [];
  const server = http.createServer((req, res) => {
    req.resume();
    asked.push(`${req.method} ${req.url} ${req.headers["last-event-id"] ?? "-"}`);
    const sse = (resume) => res.writeHead(200, { "content-type": "text/event-stream", "agui-resume": resume });
    if (req.method === "POST") {
      // The run: two events, then the connection is cut.
      sse("exact");
      res.write(frame("e-1", started));
      res.write(frame("e-2", { type: "TEXT_MESSAGE_START", messageId: "m", role: "assistant" }));
      res.write(frame("e-3", { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: "a" }));
      res.write("id: e-4\ndata: {\"type\":\"TEXT_MES"); // a frame cut short
      setImmediate(() => res.socket.destroy());
    } else if (req.headers["last-event-id"] === "e-3") {
      // e-3 is no longer journaled: a restatement, cut after two of its frames.
      sse("resync");
      res.write(restatement("e-6", "ab").slice(0, 2).join(""));
      setImmediate(() => res.socket.destroy());
    } else {
      // No id (the restatement may have been cut short): restated again, then live.
      sse("exact");
      res.end([...restatement("e-6", "ab"), ...rest].join(""));
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}/agui`;
  try {
    const agent = new ResumableHttpAgent({ url: `${url}/demo`, threadId: "t", initialMessages: [said], resume: quick });
    const r = await run(agent, "r");
    if (r.failure) return `run failed: ${r.failure.message}`;
    const expected = [
      "POST /agui/demo -",
      "GET /agui/threads/t/stream e-3",
      "GET /agui/threads/t/stream -",
    ];
    if (!isDeepStrictEqual(asked, expected)) return `requests ${JSON.stringify(asked)}`;
    const types = r.events.map((e) => e.type);
    const errors = r.events.filter((e) => e.type === "RUN_ERROR");
    // Two partial views end: the run's, and the first restatement's (cut inside it).
    if (errors.length !== 2 || errors.some((e) => e.code !== RESYNC_CODE)) return `errors ${JSON.stringify(errors)}`;
    const want =
      "RUN_STARTED,TEXT_MESSAGE_START,TEXT_MESSAGE_CONTENT,RUN_ERROR," +
      "RUN_STARTED,MESSAGES_SNAPSHOT,RUN_ERROR," +
      "RUN_STARTED,MESSAGES_SNAPSHOT,STATE_SNAPSHOT,TEXT_MESSAGE_START,TEXT_MESSAGE_CONTENT," +
      "TEXT_MESSAGE_CONTENT,TEXT_MESSAGE_END,RUN_FINISHED";
    if (types.join(",") !== want) return `events ${types.join(",")}`;
    if (!isDeepStrictEqual(agent.messages.map((m) => [m.role, m.content]), [["user", "hi"], ["assistant", "abc"]]))
      return `transcript ${JSON.stringify(agent.messages)}`;
    if (!isDeepStrictEqual(agent.state, { n: 1 })) return `state ${JSON.stringify(agent.state)}`;

    asked.length = 0;
    const strict = new ResumableHttpAgent({
      url: `${url}/demo`,
      threadId: "t",
      initialMessages: [said],
      resume: { ...quick, onResync: "fail" },
    });
    const failed = await run(strict, "r");
    if (failed.failure) return `onResync fail: run failed: ${failed.failure.message}`;
    const ending = failed.events.map((e) => e.type).join(",");
    if (ending !== "RUN_STARTED,TEXT_MESSAGE_START,TEXT_MESSAGE_CONTENT,RUN_ERROR") return `onResync fail: ${ending}`;
    if (failed.events[3].code !== RESYNC_CODE) return `onResync fail: ${JSON.stringify(failed.events[3])}`;
  } finally {
    server.close();
  }
}

const results = [];
for (const c of cases) {
  const before = logged.length;
  quiet = Boolean(c.clientErrors);
  let problem;
  try {
    problem = await c.run();
  } catch (error) {
    problem = `threw: ${error && error.stack ? error.stack : error}`;
  }
  // Late rejections land before the next case starts.
  await new Promise((resolve) => setImmediate(resolve));
  quiet = false;
  const warnings = logged.slice(before);
  if (!problem && c.clientErrors && !warnings.length) problem = "the official client did not report the cut";
  if (!problem && !c.clientErrors && warnings.length) problem = `client logged: ${warnings.join(" | ")}`;
  results.push(!problem);
  console.log(`${problem ? "FAIL" : "ok  "} [resume] @ag-ui/client ${version} :: ${c.name}${problem ? ` (${problem})` : ""}`);
}
const failed = results.filter((ok) => !ok).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
