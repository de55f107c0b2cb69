// Conformance: drives the official AG-UI clients (@ag-ui/client 1.0.0 and 0.0.59) against a
// running agui-serve. Fails on a failed run (except an expected RUN_ERROR), on any warning or
// error the client logs, and on a stream that ends without a terminal event.
//
// Usage: AGUI_URL=https://127.0.0.1:PORT/agui AGUI_TOKEN=... node run.mjs
// (for TLS with the generated certificate: NODE_EXTRA_CA_CERTS=<data-dir>/tls/cert.pem)

import * as v1 from "agui-client-1";
import * as v0 from "agui-client-0";
import { randomUUID } from "node:crypto";

const base = process.env.AGUI_URL;
const token = process.env.AGUI_TOKEN;
if (!base || !token) {
  console.error("AGUI_URL and AGUI_TOKEN are required");
  process.exit(2);
}

const clients = [
  { name: "@ag-ui/client 1.0.0", lib: v1, legacy: false },
  { name: "@ag-ui/client 0.0.59", lib: v0, legacy: true },
];

// Everything the clients print is captured; any warning or error fails the case.
const logged = [];
for (const level of ["warn", "error"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    logged.push(`${level}: ${args.map(String).join(" ")}`);
    original(...args);
  };
}

function agentFor(lib, agentName, threadId, messages) {
  return new lib.HttpAgent({
    url: `${base}/${agentName}`,
    headers: { Authorization: `Bearer ${token}` },
    threadId,
    initialMessages: messages,
  });
}

function userMessage(text) {
  return { id: randomUUID(), role: "user", content: text };
}

// Runs one agent turn; returns what happened.
async function runOnce(lib, { agentName = "demo", text, threadId = randomUUID(), onStarted }) {
  const agent = agentFor(lib, agentName, threadId, [userMessage(text)]);
  const events = [];
  let failure = null;
  let runId = randomUUID();
  try {
    await agent.runAgent(
      { runId },
      {
        onEvent({ event }) {
          events.push(event);
          if (event.type === "RUN_STARTED" && onStarted) onStarted({ runId, threadId });
        },
      },
    );
  } catch (error) {
    failure = error;
  }
  return { agent, events, failure, runId, threadId };
}

const results = [];
function record(client, name, ok, detail) {
  results.push({ client, name, ok, detail });
  console.log(`${ok ? "ok  " : "FAIL"} ${client} :: ${name}${detail ? ` (${detail})` : ""}`);
}

function terminalOf(events) {
  const last = events[events.length - 1];
  return last && (last.type === "RUN_FINISHED" || last.type === "RUN_ERROR") ? last : null;
}

function text(events) {
  return events
    .filter((e) => e.type === "TEXT_MESSAGE_CONTENT")
    .map((e) => e.delta)
    .join("");
}

const cases = [
  {
    name: "plain",
    async run(lib) {
      const r = await runOnce(lib, { text: "hello conformance" });
      const t = terminalOf(r.events);
      if (r.failure) return `run failed: ${r.failure.message}`;
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      if (text(r.events) !== "You said: hello conformance") return `text ${JSON.stringify(text(r.events))}`;
      const last = r.agent.messages[r.agent.messages.length - 1];
      if (last.role !== "assistant" || last.content !== "You said: hello conformance")
        return `client transcript ${JSON.stringify(last)}`;
    },
  },
  {
    name: "/think",
    async run(lib) {
      const r = await runOnce(lib, { text: "/think about it" });
      if (r.failure) return `run failed: ${r.failure.message}`;
      const t = terminalOf(r.events);
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      if (!r.events.some((e) => e.type === "REASONING_MESSAGE_CONTENT")) return "no reasoning";
    },
  },
  {
    name: "/slow 20",
    async run(lib) {
      const r = await runOnce(lib, { text: "/slow 20 10" });
      if (r.failure) return `run failed: ${r.failure.message}`;
      const t = terminalOf(r.events);
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      const chunks = r.events.filter((e) => e.type === "TEXT_MESSAGE_CONTENT").length;
      if (chunks !== 20) return `${chunks} chunks`;
    },
  },
  {
    name: "/fail (expected RUN_ERROR)",
    async run(lib) {
      const r = await runOnce(lib, { text: "/fail expected failure" });
      const t = terminalOf(r.events);
      if (!t || t.type !== "RUN_ERROR") return `terminal ${t && t.type}`;
      if (t.message !== "expected failure") return `message ${t.message}`;
    },
  },
  {
    name: "cancel from another connection",
    async run(lib, client) {
      let cancel = null;
      const r = await runOnce(lib, {
        text: "/slow 500 20",
        onStarted: ({ runId }) => {
          cancel = fetch(`${base}/runs/${encodeURIComponent(runId)}/cancel`, {
            method: "POST",
            headers: { Authorization: `Bearer ${token}` },
          });
        },
      });
      if (!cancel) return "never started";
      const response = await cancel;
      if (response.status !== 202) return `cancel answered ${response.status}`;
      const t = terminalOf(r.events);
      if (!t) return "no terminal event";
      if (client.legacy) {
        if (t.type !== "RUN_ERROR" || t.code !== "cancelled") return `terminal ${JSON.stringify(t)}`;
      } else {
        if (r.failure) return `run failed: ${r.failure.message}`;
        if (t.type !== "RUN_FINISHED" || t.outcome?.type !== "cancelled") return `terminal ${JSON.stringify(t)}`;
      }
    },
  },
  {
    name: "re-post the transcript after an abort: attaches to the live run",
    async run(lib) {
      const threadId = randomUUID();
      const message = userMessage("/slow 30 20");
      const first = agentFor(lib, "demo", threadId, [message]);
      let chunks = 0;
      const firstRunId = randomUUID();
      await first
        .runAgent(
          { runId: firstRunId },
          {
            onEvent({ event }) {
              if (event.type === "TEXT_MESSAGE_CONTENT" && ++chunks === 3) first.abortRun();
            },
          },
        )
        .catch(() => {});
      // A fresh client (the reloaded tab) with the same transcript.
      const second = agentFor(lib, "demo", threadId, [message]);
      const events = [];
      await second.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => events.push(event) });
      const started = events.find((e) => e.type === "RUN_STARTED");
      if (!started || started.runId !== firstRunId) return `attached to ${started && started.runId}`;
      const t = terminalOf(events);
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      const got = text(events);
      if (got.split("\n").filter(Boolean).length !== 30) return `text ${JSON.stringify(got)}`;
    },
  },
];

// Self-check: the harness must notice a broken server. A tiny local server sends a stream
// without a terminal event and one with an unknown field; both must be flagged.
async function selfCheck() {
  const http = await import("node:http");
  const streams = {
    "/no-terminal": [
      { type: "RUN_STARTED", threadId: "t", runId: "r" },
      { type: "TEXT_MESSAGE_START", messageId: "m", role: "assistant" },
      { type: "TEXT_MESSAGE_CONTENT", messageId: "m", delta: "x" },
      { type: "TEXT_MESSAGE_END", messageId: "m" },
    ],
    "/unknown-field": [
      { type: "RUN_STARTED", threadId: "t", runId: "r", bogusField: 1 },
      { type: "RUN_FINISHED", threadId: "t", runId: "r" },
    ],
  };
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "text/event-stream" });
    for (const e of streams[req.url] || []) res.write(`data: ${JSON.stringify(e)}\n\n`);
    res.end();
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  const problems = [];
  {
    const agent = new v1.HttpAgent({ url: `${url}/no-terminal` });
    const events = [];
    await agent.runAgent({ runId: "r" }, { onEvent: ({ event }) => events.push(event) }).catch(() => {});
    if (terminalOf(events)) problems.push("missing terminal event not detected");
  }
  {
    const before = logged.length;
    const agent = new v1.HttpAgent({ url: `${url}/unknown-field` });
    await agent.runAgent({ runId: "r" }).catch(() => {});
    if (logged.length === before) problems.push("client warning not captured");
    logged.length = before;
  }
  server.close();
  return problems;
}

const selfProblems = await selfCheck();
record("harness", "detects broken streams", selfProblems.length === 0, selfProblems.join("; "));

for (const client of clients) {
  for (const c of cases) {
    const before = logged.length;
    let problem;
    try {
      problem = await c.run(client.lib, client);
    } catch (error) {
      problem = `threw: ${error && error.stack ? error.stack : error}`;
    }
    const warnings = logged.slice(before);
    if (!problem && warnings.length) problem = `client logged: ${warnings.join(" | ")}`;
    record(client.name, c.name, !problem, problem);
  }
}

const failed = results.filter((r) => !r.ok).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
