// Conformance: drives the official AG-UI clients (@ag-ui/client 1.0.0 and 0.0.59) against a
// running agui-serve. Fails on a failed run (except an expected RUN_ERROR), on any warning or
// error the client logs, and on a stream that ends without a terminal event.
//
// Usage: AGUI_URL=https://127.0.0.1:PORT/agui AGUI_TOKEN=... node run.mjs
// (AGUI_LABEL, if set, prefixes every result line: which token the run used)
// (for TLS with the generated certificate: NODE_EXTRA_CA_CERTS=<data-dir>/tls/cert.pem)

import * as v1 from "agui-client-1";
import * as v0 from "agui-client-0";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { isDeepStrictEqual } from "node:util";

// The SDK's capability schema (`AgentCapabilitiesSchema`): 0.0.59's client exports it;
// 1.0.0 has it in its `@ag-ui/core`'s `schemas` entry.
const fromClient1 = createRequire(createRequire(import.meta.url).resolve("agui-client-1"));
const capabilitySchemas = new Map([
  [v0, v0.AgentCapabilitiesSchema],
  [v1, fromClient1("@ag-ui/core/schemas").AgentCapabilitiesSchema],
]);

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

// AGUI_TRANSPORT=protobuf: the agents ask for the protobuf encoding through the clients'
// hook for it (HttpAgent.requestInit), and every response they read must be protobuf.
const overProtobuf = process.env.AGUI_TRANSPORT === "protobuf";
const PROTOBUF = "application/vnd.ag-ui.event+proto";
const streamTypes = [];
const protobufAgents = new Map();
// Each client's own decoder (its `@ag-ui/proto`), for streams read without an agent.
const requireIn = (client) => createRequire(createRequire(import.meta.url).resolve(client));
const protoOf = new Map([
  [v0, requireIn("agui-client-0")("@ag-ui/proto")],
  [v1, requireIn("agui-client-1")("@ag-ui/proto")],
]);
function protobufAgent(lib) {
  if (!protobufAgents.has(lib)) {
    protobufAgents.set(
      lib,
      class extends lib.HttpAgent {
        requestInit(input) {
          const init = super.requestInit(input);
          return { ...init, headers: { ...init.headers, Accept: PROTOBUF } };
        }
      },
    );
  }
  return protobufAgents.get(lib);
}

function agentFor(lib, agentName, threadId, messages) {
  const Agent = overProtobuf ? protobufAgent(lib) : lib.HttpAgent;
  return new Agent({
    url: `${base}/${agentName}`,
    headers: { Authorization: `Bearer ${token}` },
    threadId,
    initialMessages: messages,
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      streamTypes.push(response.headers.get("content-type"));
      return response;
    },
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
const label = process.env.AGUI_LABEL ? `[${process.env.AGUI_LABEL}] ` : "";

function record(client, name, ok, detail) {
  results.push({ client, name, ok, detail });
  console.log(`${ok ? "ok  " : "FAIL"} ${label}${client} :: ${name}${detail ? ` (${detail})` : ""}`);
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
    sseOnly: "REASONING_* events have no message in the protobuf schema",
    async run(lib) {
      const r = await runOnce(lib, { text: "/think about it" });
      if (r.failure) return `run failed: ${r.failure.message}`;
      const t = terminalOf(r.events);
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      if (!r.events.some((e) => e.type === "REASONING_MESSAGE_CONTENT")) return "no reasoning";
    },
  },
  {
    name: "over protobuf, /think's reasoning arrives as CUSTOM agui.event events carrying it",
    onlyProtobuf: true,
    async run(lib) {
      const r = await runOnce(lib, { text: "/think about it" });
      if (r.failure) return `run failed: ${r.failure.message}`;
      const t = terminalOf(r.events);
      if (!t || t.type !== "RUN_FINISHED") return "no RUN_FINISHED";
      const carried = r.events.filter((e) => e.type === "CUSTOM" && e.name === "agui.event").map((e) => e.value);
      if (!carried.some((e) => e.type === "REASONING_MESSAGE_CONTENT" && e.delta)) return `carried ${JSON.stringify(carried)}`;
    },
  },
  {
    name: "over protobuf, a reattach hydrates: the client's decoder reads the snapshot of a frontend tool round trip",
    onlyProtobuf: true,
    async run(lib) {
      const tools = [{ name: "chart", description: "draws a chart", parameters: { type: "object" } }];
      const threadId = randomUUID();
      const agent = agentFor(lib, "demo", threadId, [userMessage('/tool chart {"kind":"bar"}')]);
      const first = [];
      await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => first.push(event) });
      const start = first.find((e) => e.type === "TOOL_CALL_START");
      if (!start) return "no chart call";
      agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: "a bar chart" });
      await agent.runAgent({ runId: randomUUID(), tools });
      const response = await fetch(`${base}/threads/${threadId}/stream`, {
        headers: { Authorization: `Bearer ${token}`, Accept: PROTOBUF },
      });
      if (response.headers.get("content-type") !== PROTOBUF) return `content-type ${response.headers.get("content-type")}`;
      const bytes = new Uint8Array(await response.arrayBuffer());
      const events = [];
      for (let at = 0; at < bytes.length; ) {
        const length = new DataView(bytes.buffer, bytes.byteOffset + at, 4).getUint32(0, false);
        events.push(protoOf.get(lib).decode(bytes.slice(at + 4, at + 4 + length)));
        at += 4 + length;
      }
      const types = events.map((e) => e.type).join(",");
      if (types !== "RUN_STARTED,MESSAGES_SNAPSHOT,STATE_SNAPSHOT,RUN_FINISHED") return `events ${types}`;
      const snapshot = events[1].messages.map((m) => `${m.role}:${m.id}`);
      const client = agent.messages.map((m) => `${m.role}:${m.id}`);
      if (!isDeepStrictEqual(snapshot, client)) return `snapshot ${snapshot} vs client ${client}`;
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
    name: "generative UI (/ui): every default component as an activity message; an off-list one refused",
    sseOnly: "ACTIVITY_* events have no message in the protobuf schema",
    async run(lib) {
      const examples = {
        approval_card: { title: "Deploy?", risk: "high", actions: [{ id: "ok", label: "Deploy" }] },
        choice_prompt: { question: "Which region?", options: [{ id: "eu", label: "Europe" }] },
        diff_summary: { files: [{ path: "src/a.rs", added: 3, removed: 1 }] },
        progress: { label: "Indexing", percent: 42 },
        metric: { label: "Latency", value: 12.5, unit: "ms" },
        agent_card: { name: "reviewer", status: "working" },
      };
      for (const [component, props] of Object.entries(examples)) {
        const r = await runOnce(lib, { text: `/ui ${component} ${JSON.stringify(props)}` });
        if (r.failure) return `${component}: run failed: ${r.failure.message}`;
        const activity = r.events.find((e) => e.type === "ACTIVITY_SNAPSHOT");
        if (!activity || activity.activityType !== component) return `${component}: no activity`;
        const message = r.agent.messages.find((m) => m.role === "activity");
        if (!message || JSON.stringify(message.content) !== JSON.stringify(props))
          return `${component}: client transcript ${JSON.stringify(message)}`;
      }
      const refused = await runOnce(lib, { text: '/ui script_runner {"code":"alert(1)"}' });
      if (refused.failure) return `refused: run failed: ${refused.failure.message}`;
      if (refused.events.some((e) => e.type === "ACTIVITY_SNAPSHOT")) return "an off-list component was shown";
      if (!text(refused.events).startsWith("UI refused: unknown component")) return `text ${text(refused.events)}`;
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
  {
    name: "frontend tool round trip (/tool)",
    async run(lib) {
      const tools = [{ name: "chart", description: "draws a chart", parameters: { type: "object" } }];
      const agent = agentFor(lib, "demo", randomUUID(), [userMessage('/tool chart {"kind":"bar"}')]);
      const first = [];
      await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => first.push(event) });
      const start = first.find((e) => e.type === "TOOL_CALL_START");
      if (!start || start.toolCallName !== "chart") return "no chart call";
      const t1 = terminalOf(first);
      if (!t1 || t1.type !== "RUN_FINISHED") return "first segment did not finish";
      agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: "a bar chart" });
      const second = [];
      await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => second.push(event) });
      if (text(second) !== "Tool chart returned: a bar chart") return `reply ${JSON.stringify(text(second))}`;
      if (second.some((e) => e.type === "TOOL_CALL_RESULT")) return "browser result echoed back";
    },
  },
  {
    name: "approve and deny via agui_permission_request",
    async run(lib) {
      for (const [optionId, verdict] of [["allow", "Approved"], ["deny", "Denied"]]) {
        const tools = [{ name: "agui_permission_request", description: "ask the user", parameters: { type: "object" } }];
        const agent = agentFor(lib, "demo", randomUUID(), [userMessage("/approve deploy")]);
        const first = [];
        await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => first.push(event) });
        const start = first.find((e) => e.type === "TOOL_CALL_START" && e.toolCallName === "agui_permission_request");
        if (!start) return "no permission request";
        const args = JSON.parse(
          first.filter((e) => e.type === "TOOL_CALL_ARGS" && e.toolCallId === start.toolCallId).map((e) => e.delta).join(""),
        );
        if (!args.title || !Array.isArray(args.options) || !args.options.some((o) => o.optionId === optionId))
          return `arguments ${JSON.stringify(args)}`;
        agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: JSON.stringify({ optionId }) });
        const second = [];
        await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => second.push(event) });
        if (text(second) !== `${verdict}: deploy`) return `reply ${JSON.stringify(text(second))}`;
      }
    },
  },
  {
    name: "todo list through snapshot + deltas matches the daemon's document",
    async run(lib) {
      const threadId = randomUUID();
      const agent = agentFor(lib, "demo", threadId, [userMessage("/todo plan; build; ship")]);
      await agent.runAgent({ runId: randomUUID() });
      const todos = agent.state && agent.state.todos;
      if (!Array.isArray(todos) || todos.length !== 3 || todos[2].content !== "ship")
        return `client state ${JSON.stringify(agent.state)}`;
      const response = await fetch(`${base}/threads/${threadId}/stream`, {
        headers: { Authorization: `Bearer ${token}`, Accept: "text/event-stream" },
      });
      const body = await response.text();
      const snapshot = body
        .split("\n\n")
        .map((frame) => frame.split("\n").find((l) => l.startsWith("data: ")))
        .filter(Boolean)
        .map((l) => JSON.parse(l.slice(6)))
        .find((e) => e.type === "STATE_SNAPSHOT");
      if (!snapshot) return "no daemon snapshot";
      // Deep equality: the protobuf encoding carries objects as maps, whose keys have no order.
      if (!isDeepStrictEqual(snapshot.snapshot, agent.state))
        return `daemon ${JSON.stringify(snapshot.snapshot)} vs client ${JSON.stringify(agent.state)}`;
    },
  },
  {
    name: "interrupt answered with resume from buildResumeArray",
    sseOnly: "TOOL_CALL_RESULT has no message in the protobuf schema",
    onlyV1: true,
    async run(lib) {
      for (const [optionId, verdict] of [["allow", "Approved"], ["deny", "Denied"]]) {
        const agent = agentFor(lib, "demo-interrupt", randomUUID(), [userMessage("/approve launch")]);
        const first = [];
        await agent.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => first.push(event) });
        const t = terminalOf(first);
        if (!t || t.outcome?.type !== "interrupt") return `first terminal ${JSON.stringify(t)}`;
        if (agent.pendingInterrupts.length !== 1) return `pending ${agent.pendingInterrupts.length}`;
        const interrupt = agent.pendingInterrupts[0];
        const resume = lib.buildResumeArray(agent.pendingInterrupts, {
          [interrupt.id]: { status: "resolved", payload: { optionId } },
        });
        const second = [];
        await agent.runAgent({ runId: randomUUID(), resume }, { onEvent: ({ event }) => second.push(event) });
        if (second.some((e) => e.type === "TOOL_CALL_START")) return "tool call re-emitted";
        const result = second.find((e) => e.type === "TOOL_CALL_RESULT");
        if (!result || result.toolCallId !== interrupt.toolCallId) return "no result for the original call";
        if (text(second) !== `${verdict}: launch`) return `reply ${JSON.stringify(text(second))}`;
      }
    },
  },
];

// The same clients against ACP agents fronted by the daemon: the scripted agent (built on
// the official Rust SDK) and an agent written with the Python SDK.
async function acpRun(lib, agentName, text, tools) {
  const agent = agentFor(lib, agentName, randomUUID(), [userMessage(text)]);
  const events = [];
  await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => events.push(event) });
  return { agent, events };
}

async function acpPermission(lib, agentName, optionIndex, expected) {
  const tools = [{ name: "agui_permission_request", description: "ask the user", parameters: { type: "object" } }];
  const { agent, events } = await acpRun(lib, agentName, "permission", tools);
  const start = events.find((e) => e.type === "TOOL_CALL_START" && e.toolCallName === "agui_permission_request");
  if (!start) return "no permission request";
  const args = JSON.parse(
    events.filter((e) => e.type === "TOOL_CALL_ARGS" && e.toolCallId === start.toolCallId).map((e) => e.delta).join(""),
  );
  const option = args.options[optionIndex];
  agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: JSON.stringify({ optionId: option.optionId }) });
  const second = [];
  await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => second.push(event) });
  if (!second.some((e) => e.type === "TOOL_CALL_RESULT")) return "no tool result after the answer";
  if (text(second) !== expected) return `reply ${JSON.stringify(text(second))}`;
}

// New user input while a permission request is pending, instead of the answer: the old
// turn's wait fails closed, and the new message is prompted to the agent as its own turn,
// whose reply arrives on the new run's stream.
async function supersedePermission(lib, agentName, trigger, expected) {
  const tools = [{ name: "agui_permission_request", description: "ask the user", parameters: { type: "object" } }];
  const agent = agentFor(lib, agentName, randomUUID(), [userMessage(trigger)]);
  const first = [];
  await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => first.push(event) });
  if (!first.some((e) => e.type === "TOOL_CALL_START" && e.toolCallName === "agui_permission_request"))
    return `${agentName}: no permission request`;
  agent.addMessage(userMessage("hello again"));
  const second = [];
  const runId = randomUUID();
  await agent.runAgent({ runId, tools }, { onEvent: ({ event }) => second.push(event) });
  const t = terminalOf(second);
  if (!t || t.type !== "RUN_FINISHED") return `${agentName}: terminal ${JSON.stringify(t)}`;
  if (second[0].runId !== runId) return `${agentName}: stream of run ${second[0].runId}`;
  if (text(second) !== expected) return `${agentName}: reply ${JSON.stringify(text(second))}`;
}

cases.push({
  name: "new input while a permission is pending is answered as its own turn (demo, ACP scripted, ACP Python)",
  async run(lib) {
    return (
      (await supersedePermission(lib, "demo", "/approve deploy", "You said: hello again")) ||
      (await supersedePermission(lib, "scripted", "permission", "Echo: hello again")) ||
      (await supersedePermission(lib, "python", "permission", "Python says: hello again"))
    );
  },
});

cases.push({
  name: "/info: every agent's capabilities parse with the SDK's AgentCapabilitiesSchema, nothing left out; each is resumable and says how",
  async run(lib) {
    const schema = capabilitySchemas.get(lib);
    if (!schema) return "no AgentCapabilitiesSchema in this client";
    const response = await fetch(`${base}/info`, { headers: { Authorization: `Bearer ${token}` } });
    if (response.status !== 200) return `/info: ${response.status}`;
    const info = await response.json();
    const agents = Object.values(info.agents ?? {});
    if (agents.length === 0) return "no agents";
    for (const agent of agents) {
      const caps = agent.capabilities;
      if (!caps) return `${agent.name}: no capabilities`;
      const parsed = schema.safeParse(caps);
      if (!parsed.success) return `${agent.name}: ${parsed.error.message}`;
      // The schema strips what it does not know: a field lost is one the SDK does not have.
      if (!isDeepStrictEqual(parsed.data, caps)) return `${agent.name}: fields outside the schema in ${JSON.stringify(caps)}`;
    }
    const demo = info.agents.demo?.capabilities;
    if (demo && demo.multimodal?.input?.image !== false) return `demo: ${JSON.stringify(demo.multimodal)}`;
    // Resumable, and how: the stream route and the client package in this repository.
    const resumeClient = JSON.parse(readFileSync(new URL("../clients/resume/package.json", import.meta.url), "utf8")).name;
    for (const agent of agents) {
      const { transport, custom } = agent.capabilities;
      if (transport?.resumable !== true) return `${agent.name}: transport ${JSON.stringify(transport)}`;
      if (custom?.resume?.stream !== `${info.path}/threads/{threadId}/stream` || custom.resume.client !== resumeClient)
        return `${agent.name}: custom ${JSON.stringify(custom)}`;
    }
  },
});

const acpCases = [
  {
    name: "ACP scripted: text, thought, tool call, plan, usage, misc",
    sseOnly: "a thought (REASONING_*) and TOOL_CALL_RESULT have no message in the protobuf schema",
    async run(lib) {
      for (const [prompt, check] of [
        ["hello acp", (ev) => text(ev) === "Echo: hello acp"],
        ["think", (ev) => ev.some((e) => e.type === "REASONING_MESSAGE_CONTENT")],
        ["tool", (ev) => ev.some((e) => e.type === "TOOL_CALL_RESULT")],
        [
          "terminal",
          (ev, agent) =>
            ev.some((e) => e.type === "ACTIVITY_DELTA" && e.activityType === "terminal") &&
            ev.some((e) => e.type === "TOOL_CALL_RESULT" && e.content === "one\ntwo\n\n(exit code 0)") &&
            agent.messages.some(
              (m) => m.role === "activity" && m.activityType === "terminal" && m.content.exit && m.content.exit.exitCode === 0,
            ),
        ],
        ["plan", (_ev, agent) => agent.state && agent.state.todos && agent.state.todos.length === 3],
        ["usage", (_ev, agent) => agent.state && agent.state.usage && agent.state.usage.used === 1200],
        ["misc", (ev) => ev.some((e) => e.type === "CUSTOM" && e.name === "acp.something_new")],
      ]) {
        const { agent, events } = await acpRun(lib, "scripted", prompt);
        const t = terminalOf(events);
        if (!t || t.type !== "RUN_FINISHED") return `${prompt}: terminal ${t && t.type}`;
        if (!check(events, agent)) return `${prompt}: unexpected stream`;
      }
    },
  },
  {
    name: "ACP scripted: permission approved and denied via agui_permission_request",
    sseOnly: "TOOL_CALL_RESULT has no message in the protobuf schema",
    async run(lib) {
      return (
        (await acpPermission(lib, "scripted", 0, "Permission allowed.")) ||
        (await acpPermission(lib, "scripted", 2, "Permission rejected."))
      );
    },
  },
  {
    name: "ACP scripted: frontend tool over MCP, one call on the stream",
    async run(lib) {
      const tools = [{ name: "chart", description: "draws a chart", parameters: { type: "object" } }];
      const { agent, events } = await acpRun(lib, "scripted", 'mcp chart {"kind":"pie"}', tools);
      const starts = events.filter((e) => e.type === "TOOL_CALL_START");
      if (starts.length !== 1 || starts[0].toolCallName !== "chart") return `tool calls ${JSON.stringify(starts)}`;
      agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: starts[0].toolCallId, content: "a pie chart" });
      const second = [];
      await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => second.push(event) });
      if (text(second) !== "MCP chart returned: a pie chart") return `reply ${JSON.stringify(text(second))}`;
    },
  },
  {
    name: "ACP Python SDK agent: streaming text",
    async run(lib) {
      const { events } = await acpRun(lib, "python", "hello python");
      if (text(events) !== "Python says: hello python") return `text ${JSON.stringify(text(events))}`;
    },
  },
  {
    name: "ACP Python SDK agent: permission approved and denied",
    sseOnly: "TOOL_CALL_RESULT has no message in the protobuf schema",
    async run(lib) {
      return (
        (await acpPermission(lib, "python", 0, "Python: allowed")) ||
        (await acpPermission(lib, "python", 1, "Python: rejected"))
      );
    },
  },
  {
    name: "ACP token usage: RUN_FINISHED.usage for 1.0 clients, state for both (scripted, Python)",
    async run(lib, client) {
      for (const [agentName, total] of [["scripted", 150], ["python", 30]]) {
        const { agent, events } = await acpRun(lib, agentName, "usage");
        const t = terminalOf(events);
        if (!t || t.type !== "RUN_FINISHED") return `${agentName}: terminal ${t && t.type}`;
        if (client.legacy) {
          if (t.usage !== undefined) return `${agentName}: usage sent to a pre-1.0 client`;
        } else if (!Array.isArray(t.usage) || t.usage[0].totalTokens !== total) {
          return `${agentName}: usage ${JSON.stringify(t.usage)}`;
        }
        const usage = agent.state && agent.state.usage;
        if (!usage || !usage.turn || usage.turn.totalTokens !== total || usage.total.totalTokens !== total)
          return `${agentName}: state ${JSON.stringify(agent.state)}`;
      }
    },
  },
  {
    name: "ACP form (elicitation) as an agui_input_request tool call: accepted and declined (scripted, Python)",
    async run(lib) {
      return (
        (await acpFormByTool(lib, "scripted", { action: "accept", content: { name: "Ada" } }, 'Form accepted: {"name":"Ada"}')) ||
        (await acpFormByTool(lib, "scripted", { action: "decline" }, "Form declined.")) ||
        (await acpFormByTool(lib, "python", { action: "accept", content: { name: "Ada" } }, "Python got: Ada")) ||
        (await acpFormByTool(lib, "python", { action: "decline" }, "Python: declined"))
      );
    },
  },
  {
    name: "ACP form (elicitation) as an input_required interrupt answered with resume (scripted, Python)",
    async run(lib) {
      return (
        (await acpFormByInterrupt(lib, "scripted-interrupt", { status: "resolved", payload: { name: "Bo", age: 7 } }, 'Form accepted: {"age":7,"name":"Bo"}')) ||
        (await acpFormByInterrupt(lib, "scripted-interrupt", { status: "cancelled" }, "Form declined.")) ||
        (await acpFormByInterrupt(lib, "python-interrupt", { status: "resolved", payload: { name: "Bo" } }, "Python got: Bo"))
      );
    },
  },
  {
    name: "ACP subagents: SUBAGENT_STARTED, its message (subagentRunId) and updates, SUBAGENT_FINISHED / SUBAGENT_ERROR",
    async run(lib) {
      const { agent, events } = await acpRun(lib, "scripted", "subagent");
      const t = terminalOf(events);
      if (!t || t.type !== "RUN_FINISHED") return `terminal ${t && t.type}`;
      const started = events.find((e) => e.type === "SUBAGENT_STARTED");
      if (!started || started.name !== "researcher") return "no SUBAGENT_STARTED";
      const said = events.find((e) => e.type === "TEXT_MESSAGE_START" && e.subagentRunId === started.subagentRunId);
      if (!said) return "no message of the subagent";
      const plan = events.find((e) => e.type === "CUSTOM" && e.name === "acp.subagent.plan");
      if (!plan || plan.value.subagentRunId !== started.subagentRunId) return "no subagent update";
      const finished = events.find((e) => e.type === "SUBAGENT_FINISHED");
      if (!finished || finished.subagentRunId !== started.subagentRunId) return "no SUBAGENT_FINISHED";
      // The client files the subagent's message under it, and the reply under the agent.
      const theirs = agent.messages.find((m) => m.id === said.messageId);
      if (!theirs || theirs.content !== "Looking it up.") return `client transcript ${JSON.stringify(agent.messages)}`;
      if (theirs.subagentRunId !== started.subagentRunId) return `attributed to ${theirs.subagentRunId}`;
      const last = agent.messages[agent.messages.length - 1];
      if (last.content !== "Subagent done." || last.subagentRunId !== undefined) return `reply ${JSON.stringify(last)}`;
      const failed = await acpRun(lib, "scripted", "subagent-fail");
      const error = failed.events.find((e) => e.type === "SUBAGENT_ERROR");
      if (!error || error.message !== "the lookup failed") return "no SUBAGENT_ERROR";
      const t2 = terminalOf(failed.events);
      if (!t2 || t2.type !== "RUN_FINISHED") return `terminal ${t2 && t2.type}`;
    },
  },
];
cases.push(...acpCases);

async function acpFormByTool(lib, agentName, answer, expected) {
  const tools = [{ name: "agui_input_request", description: "ask the user to fill in a form", parameters: { type: "object" } }];
  const { agent, events } = await acpRun(lib, agentName, "elicit", tools);
  const start = events.find((e) => e.type === "TOOL_CALL_START" && e.toolCallName === "agui_input_request");
  if (!start) return `${agentName}: no form request`;
  const args = JSON.parse(
    events.filter((e) => e.type === "TOOL_CALL_ARGS" && e.toolCallId === start.toolCallId).map((e) => e.delta).join(""),
  );
  if (!args.message || !args.schema || !args.schema.properties || !args.schema.properties.name)
    return `${agentName}: arguments ${JSON.stringify(args)}`;
  agent.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: JSON.stringify(answer) });
  const second = [];
  await agent.runAgent({ runId: randomUUID(), tools }, { onEvent: ({ event }) => second.push(event) });
  if (text(second) !== expected) return `${agentName}: reply ${JSON.stringify(text(second))}`;
}

async function acpFormByInterrupt(lib, agentName, answer, expected) {
  const agent = agentFor(lib, agentName, randomUUID(), [userMessage("elicit")]);
  const first = [];
  await agent.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => first.push(event) });
  const t = terminalOf(first);
  if (!t || t.outcome?.type !== "interrupt") return `${agentName}: first terminal ${JSON.stringify(t)}`;
  if (agent.pendingInterrupts.length !== 1) return `${agentName}: pending ${agent.pendingInterrupts.length}`;
  const interrupt = agent.pendingInterrupts[0];
  if (interrupt.reason !== "input_required" || !interrupt.responseSchema?.properties?.name)
    return `${agentName}: interrupt ${JSON.stringify(interrupt)}`;
  const resume = lib.buildResumeArray(agent.pendingInterrupts, { [interrupt.id]: answer });
  const second = [];
  await agent.runAgent({ runId: randomUUID(), resume }, { onEvent: ({ event }) => second.push(event) });
  if (text(second) !== expected) return `${agentName}: reply ${JSON.stringify(text(second))}`;
}

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
    if (c.onlyV1 && client.legacy) continue;
    if (c.onlyProtobuf && !overProtobuf) continue;
    if (overProtobuf && c.sseOnly) {
      console.log(`skip ${label}${client.name} :: ${c.name} (over protobuf: ${c.sseOnly})`);
      continue;
    }
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

if (overProtobuf) {
  const other = streamTypes.filter((type) => type !== PROTOBUF && type !== "application/json");
  record("transport", "every stream the clients read was protobuf", streamTypes.length > 0 && other.length === 0, other.join(", "));
}

const failed = results.filter((r) => !r.ok).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
