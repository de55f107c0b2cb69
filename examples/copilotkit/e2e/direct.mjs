// CopilotKit's own client classes against agui-serve directly (no CopilotKit runtime in
// between): `ProxiedCopilotRuntimeAgent` from @copilotkit/core, over the REST routes and
// over the single-endpoint envelope, for run, connect (finished, unknown, live and
// suspended threads) and stop. Env: AGUI_BASE (the daemon's {path} URL), AGUI_TOKEN_FILE.
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { ProxiedCopilotRuntimeAgent } from "@copilotkit/core";

const base = process.env.AGUI_BASE;
const token = readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").trim();
const headers = { Authorization: `Bearer ${token}` };
let failures = 0;

function check(name, ok, detail) {
  if (ok) {
    console.log(`ok   ${name}`);
  } else {
    failures += 1;
    console.log(`FAIL ${name}: ${detail ?? ""}`);
  }
}

function agentFor(transport, threadId) {
  const agent = new ProxiedCopilotRuntimeAgent({
    runtimeUrl: base,
    agentId: "demo",
    headers,
    transport,
  });
  agent.threadId = threadId;
  return agent;
}

function say(agent, text) {
  agent.addMessage({ id: randomUUID(), role: "user", content: text });
}

const texts = (agent) =>
  agent.messages.filter((m) => m.role === "assistant").map((m) => m.content ?? "");

async function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// /info: the shape CopilotKit reads (agents keyed by id).
{
  const info = await (await fetch(`${base}/info`, { headers })).json();
  check("info: agents keyed by id", info.agents?.demo?.name === "demo", JSON.stringify(info));
  check("info: sse mode", info.mode === "sse", info.mode);
}

for (const transport of ["rest", "single"]) {
  const t = (name) => `${transport}: ${name}`;

  // run
  const thread = `ck-${transport}-${randomUUID()}`;
  const first = agentFor(transport, thread);
  say(first, "hello there");
  await withTimeout(first.runAgent(), 10_000, "run");
  check(t("run streams the reply"), texts(first).includes("You said: hello there"), JSON.stringify(first.messages));

  // connect on the finished thread: a fresh client gets the conversation back.
  const reloaded = agentFor(transport, thread);
  await withTimeout(reloaded.connectAgent(), 10_000, "connect");
  check(
    t("connect restores the conversation"),
    reloaded.messages.some((m) => m.role === "user" && m.content === "hello there") &&
      texts(reloaded).includes("You said: hello there"),
    JSON.stringify(reloaded.messages),
  );

  // connect on a thread the daemon has never seen: no error, nothing.
  const fresh = agentFor(transport, `ck-unknown-${randomUUID()}`);
  await withTimeout(fresh.connectAgent(), 10_000, "connect unknown");
  check(t("connect on an unknown thread is empty"), fresh.messages.length === 0, JSON.stringify(fresh.messages));

  // A live run: a second client connects mid-reply and follows it; stop ends both.
  const liveThread = `ck-live-${transport}-${randomUUID()}`;
  const runner = agentFor(transport, liveThread);
  say(runner, "/slow 200 50");
  const running = withTimeout(runner.runAgent(), 15_000, "slow run");
  await new Promise((resolve) => setTimeout(resolve, 600));
  const joiner = agentFor(transport, liveThread);
  const joined = withTimeout(joiner.connectAgent(), 15_000, "connect live");
  await new Promise((resolve) => setTimeout(resolve, 400));
  const started = Date.now();
  runner.abortRun();
  await Promise.allSettled([running, joined]);
  check(t("stop ends the run well before it would finish"), Date.now() - started < 5_000, `${Date.now() - started} ms`);
  const threadInfo = await (await fetch(`${base}/threads/${encodeURIComponent(liveThread)}`, { headers })).json();
  check(t("the daemon cancelled the run"), threadInfo.lastRun?.outcome === "cancelled", JSON.stringify(threadInfo.lastRun));
  check(
    t("the connected client saw the live reply"),
    texts(joiner).some((text) => text.includes("chunk 1/200")),
    JSON.stringify(joiner.messages).slice(0, 400),
  );

  // A suspended run: connect shows the question it waits on.
  const waitThread = `ck-wait-${transport}-${randomUUID()}`;
  const asker = agentFor(transport, waitThread);
  say(asker, "/approve deploy");
  await withTimeout(asker.runAgent(), 10_000, "suspended run");
  const again = agentFor(transport, waitThread);
  await withTimeout(again.connectAgent(), 10_000, "connect suspended");
  const calls = again.messages.flatMap((m) => m.toolCalls ?? []);
  check(
    t("connect on a suspended run shows the pending question"),
    calls.some((c) => c.function?.name === "agui_permission_request"),
    JSON.stringify(again.messages),
  );
  await fetch(`${base}/threads/${encodeURIComponent(waitThread)}`, { method: "DELETE", headers });
}

if (failures > 0) {
  console.log(`${failures} CopilotKit client check(s) failed`);
  process.exit(1);
}
console.log("ok: CopilotKit's client classes work against agui-serve directly");
process.exit(0);
