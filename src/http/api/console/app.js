// The operator console: the fleet live from {path}/fleet/stream, transcripts from the thread
// routes, the webhook outbox from {path}/webhooks, and answers to waiting approvals through
// the normal run route. Everything the
// daemon or an agent says is rendered as text (textContent), never as HTML.
"use strict";

const base = location.pathname.replace(/\/console\/?$/, "");
const TOKEN_KEY = "agui-serve-console-token";
const $ = (id) => document.getElementById(id);

let fleet = null;
// Each agent's reach (from /info): its relays' hosts and egress rules, names only.
let reach = {};
let source = null;

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function status(text) {
  $("status").textContent = text;
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

// RFC 6902, the operations the daemon's diffs use (add, remove, replace), plus test.
// Keys are a client's thread ids: every one (`__proto__` too) is read and written as an
// own property, never through the prototype.
function unescape(segment) {
  return segment.replace(/~1/g, "/").replace(/~0/g, "~");
}

function child(parent, key) {
  if (Array.isArray(parent)) return parent[Number(key)];
  return Object.hasOwn(parent, key) ? parent[key] : undefined;
}

function put(object, key, value) {
  Object.defineProperty(object, key, { value, writable: true, enumerable: true, configurable: true });
}

function applyPatch(doc, ops) {
  for (const op of ops) {
    const path = op.path.split("/").slice(1).map(unescape);
    if (path.length === 0) {
      if (op.op === "add" || op.op === "replace") doc = structuredClone(op.value);
      continue;
    }
    let parent = doc;
    for (const key of path.slice(0, -1)) parent = child(parent, key);
    const last = path[path.length - 1];
    if (Array.isArray(parent)) {
      const index = last === "-" ? parent.length : Number(last);
      if (op.op === "add") parent.splice(index, 0, structuredClone(op.value));
      else if (op.op === "remove") parent.splice(index, 1);
      else if (op.op === "replace") parent[index] = structuredClone(op.value);
    } else if (op.op === "add" || op.op === "replace") {
      put(parent, last, structuredClone(op.value));
    } else if (op.op === "remove" && Object.hasOwn(parent, last)) {
      delete parent[last];
    }
  }
  return doc;
}

async function api(path, init = {}) {
  const response = await fetch(base + path, {
    ...init,
    headers: { Authorization: `Bearer ${token()}`, ...(init.headers || {}) },
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("The token was refused; enter it again.");
    throw new Error("unauthorized");
  }
  return response;
}

function ownerQuery(owner) {
  return owner ? `?owner=${encodeURIComponent(owner)}` : "";
}

function render() {
  if (!fleet) return;
  const runs = Object.entries(fleet.runs || {}).sort(([, a], [, b]) =>
    String(a.startedAt).localeCompare(String(b.startedAt)),
  );
  const totals = fleet.totals || {};
  $("totals").textContent = `(${totals.live ?? 0} live, ${totals.suspended ?? 0} waiting)`;
  const body = $("runs");
  body.replaceChildren();
  for (const [key, run] of runs) {
    const row = el("tr", undefined, { "data-key": key, "data-thread": run.threadId });
    if (run.phase === "suspended") row.className = "suspended";
    const thread = el("td");
    const open = el("button", run.threadId, { type: "button", "aria-label": `Open ${run.threadId}` });
    open.addEventListener("click", () => openTranscript(run.threadId, run.owner));
    thread.append(open);
    row.append(thread, el("td", run.owner || "operator"), el("td", run.agent), el("td", run.phase));
    row.append(el("td", run.startedAt ? new Date(run.startedAt).toLocaleTimeString() : ""));
    const waits = el("td");
    for (const wait of run.waitingFor || []) {
      waits.append(el("span", `${wait.kind} `));
      if (wait.kind === "approval") {
        for (const choice of ["allow", "deny"]) {
          const button = el("button", choice === "allow" ? "Approve" : "Deny", { type: "button" });
          if (choice === "allow") button.className = "primary";
          button.addEventListener("click", () => answer(run, wait.id, choice, button));
          waits.append(button, " ");
        }
      }
    }
    row.append(waits);
    body.append(row);
  }
  $("no-runs").hidden = runs.length > 0;
  const agents = $("agents");
  agents.replaceChildren();
  for (const [name, agent] of Object.entries(fleet.agents || {})) {
    const processes = agent.processes ? ` (${agent.processes.busy} busy, ${agent.processes.idle} idle)` : "";
    const item = el("li", `${name}: ${agent.state}${processes}`);
    const may = reach[name];
    if (may) {
      const hosts = [...may.relays.map((host) => `${host} (relay)`), ...may.egress.allow];
      item.append(el("div", `reaches: ${hosts.length ? hosts.join(", ") : "nothing beyond its sandbox"}`));
    }
    const egress = agent.egress;
    if (egress && egress.denied) {
      const last = egress.lastDenied;
      const said = last ? `; last ${last.host}:${last.port}, ${last.rule}, ${when(last.atMs)}` : "";
      item.append(el("div", `egress refused ${egress.denied} time(s)${said}`, { class: "warn" }));
    }
    agents.append(item);
  }
}

// Answers a permission wait: the thread's transcript plus the tool message that names the
// chosen option, posted to the run route (the run then goes on, detached from this page).
async function answer(run, callId, choice, button) {
  button.disabled = true;
  try {
    const query = ownerQuery(run.owner);
    const transcript = await (await api(`/threads/${encodeURIComponent(run.threadId)}/messages${query}`)).json();
    const messages = transcript.messages.filter((m) => m.role !== "activity");
    const call = messages
      .flatMap((m) => m.toolCalls || [])
      .find((c) => c.id === callId);
    let option = choice;
    try {
      const offered = JSON.parse(call.function.arguments).options || [];
      const wanted = offered.find((o) => (o.kind || "").startsWith(choice === "allow" ? "allow" : "reject"));
      if (wanted) option = wanted.optionId;
    } catch {
      // No readable options: the plain allow / deny ids.
    }
    messages.push({
      id: crypto.randomUUID(),
      role: "tool",
      toolCallId: callId,
      content: JSON.stringify({ optionId: option }),
    });
    const response = await api(`/${encodeURIComponent(run.agent)}${query}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({
        threadId: run.threadId,
        runId: crypto.randomUUID(),
        protocolVersion: "1.0",
        messages,
      }),
    });
    if (!response.ok) {
      status(`The answer was refused: HTTP ${response.status}`);
      button.disabled = false;
      return;
    }
    status(`Answered ${run.threadId}: ${choice}`);
    // Read the stream to its end so the run is followed, not abandoned.
    const reader = response.body.getReader();
    while (!(await reader.read()).done) {
      // The fleet stream shows the run's progress.
    }
  } catch (error) {
    if (error.message !== "unauthorized") status(`The answer failed: ${error.message}`);
    button.disabled = false;
  }
}

async function openTranscript(threadId, owner) {
  const response = await api(`/threads/${encodeURIComponent(threadId)}/messages${ownerQuery(owner)}`);
  if (!response.ok) {
    status(`No transcript for ${threadId}: HTTP ${response.status}`);
    return;
  }
  const body = await response.json();
  $("transcript-title").textContent = owner ? `${threadId} (${owner})` : threadId;
  const list = $("messages");
  list.replaceChildren();
  for (const message of body.messages) {
    const item = el("li");
    item.append(el("span", message.role, { class: "role" }));
    let text = message.content;
    if (Array.isArray(text)) text = text.map((part) => part.text ?? `[${part.type}]`).join(" ");
    if (message.role === "activity") text = `${message.activityType} ${JSON.stringify(message.content)}`;
    if (text === undefined || text === null) text = "";
    if (message.toolCalls) {
      text += message.toolCalls.map((c) => ` [${c.function.name}]`).join("");
    }
    item.append(document.createTextNode(String(text)));
    list.append(item);
  }
  $("transcript").hidden = false;
}

async function loadReach() {
  try {
    const info = await (await api("/info")).json();
    reach = {};
    for (const [name, agent] of Object.entries(info.agents || {})) {
      if (agent.reach) reach[name] = agent.reach;
    }
    render();
  } catch {
    // Shown by the status line.
  }
}

async function loadThreads() {
  try {
    const body = await (await api("/threads?limit=50")).json();
    const list = $("threads");
    list.replaceChildren();
    for (const thread of body.threads) {
      const item = el("li");
      const button = el("button", thread.title || thread.threadId, { type: "button" });
      button.addEventListener("click", () => openTranscript(thread.threadId, thread.owner));
      const queued = thread.queued ? `, ${thread.queued} queued` : "";
      item.append(button, ` ${thread.agent}, ${thread.status}${queued}${thread.owner ? `, ${thread.owner}` : ""}`);
      list.append(item);
    }
  } catch {
    // Shown by the status line.
  }
}

// Each webhook endpoint's outbox, one line (hidden when none is configured).
async function loadWebhooks() {
  try {
    const body = await (await api("/webhooks")).json();
    const list = $("webhooks");
    list.replaceChildren();
    for (const hook of body.endpoints || []) {
      let line = `${hook.name}${hook.configured ? "" : " (not configured)"}: ${hook.pending} pending`;
      if (hook.failing) line += `, ${hook.failing} failing`;
      if (hook.lastDeliveredAt) line += `, last delivered ${new Date(hook.lastDeliveredAt).toLocaleTimeString()}`;
      if (hook.lastError) line += `, last error: ${hook.lastError.message}`;
      list.append(el("li", line));
    }
    $("webhooks-section").hidden = list.childElementCount === 0;
  } catch {
    // Shown by the status line.
  }
}

function when(time) {
  return time ? new Date(time).toLocaleString() : "";
}

// Schedules (every principal's for the operator): when each fires next, how its last
// firing went, what was missed; a delete button each.
async function loadSchedules() {
  try {
    const body = await (await api("/schedules")).json();
    const rows = $("schedules");
    rows.replaceChildren();
    for (const schedule of body.schedules) {
      const row = el("tr", undefined, { "data-schedule": schedule.id });
      const thread = el("td");
      const shown = schedule.threadId || schedule.lastThreadId;
      if (shown) {
        const open = el("button", shown, { type: "button", "aria-label": `Open ${shown}` });
        open.addEventListener("click", () => openTranscript(shown, schedule.owner));
        thread.append(open);
      }
      if (!schedule.threadId) thread.append(" (new each time)");
      let last = schedule.lastStatus ? `${schedule.lastStatus} ${when(schedule.lastRunAt)}` : "never";
      if (schedule.lastError) last += `: ${schedule.lastError}`;
      const missed = schedule.missed.count
        ? `${schedule.missed.count} (${when(schedule.missed.first)} to ${when(schedule.missed.last)})`
        : "0";
      const remove = el("button", "Delete", { type: "button" });
      remove.addEventListener("click", async () => {
        remove.disabled = true;
        const response = await api(`/schedules/${encodeURIComponent(schedule.id)}`, { method: "DELETE" });
        if (!response.ok) status(`Schedule ${schedule.id} not deleted: HTTP ${response.status}`);
        loadSchedules();
      });
      row.append(el("td", schedule.name || schedule.id), el("td", schedule.owner || "operator"));
      row.append(el("td", schedule.agent), el("td", `${schedule.cron} ${schedule.timezone}`), thread);
      row.append(el("td", when(schedule.nextRunAt)), el("td", last), el("td", missed));
      const actions = el("td");
      actions.append(remove);
      row.append(actions);
      rows.append(row);
    }
    $("no-schedules").hidden = body.schedules.length > 0;
  } catch {
    // Shown by the status line.
  }
}

function connect() {
  if (source) source.close();
  status("Connecting...");
  source = new EventSource(`${base}/fleet/stream?token=${encodeURIComponent(token())}`);
  source.onopen = () => status("Live");
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "STATE_SNAPSHOT") fleet = event.snapshot;
    else if (event.type === "STATE_DELTA" && fleet) fleet = applyPatch(fleet, event.delta);
    render();
  };
  source.onerror = () => status("Reconnecting...");
  $("login").hidden = true;
  $("fleet").hidden = false;
  loadReach();
  loadThreads();
  loadWebhooks();
  loadSchedules();
}

function showLogin(message) {
  if (source) source.close();
  $("login").hidden = false;
  $("fleet").hidden = true;
  status(message || "Enter the operator token.");
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    connect();
  });
  $("close-transcript").addEventListener("click", () => {
    $("transcript").hidden = true;
  });
  setInterval(() => {
    if (token() && !$("fleet").hidden) {
      loadThreads();
      loadWebhooks();
      loadSchedules();
    }
  }, 5000);
  if (token()) connect();
  else showLogin();
});
