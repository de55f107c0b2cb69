// The operator console. The fleet stream ({path}/fleet/stream: live and waiting runs,
// agents, queues, each principal's spending) drives the page; the thread routes give
// titles and transcripts, and are read again when the fleet says a run started or ended,
// never on a timer, so the thread list's status is always the live table's. Actions go
// through the daemon's own routes with the token given (an operator token sees every
// principal's runs; a principal's token its own). Everything the daemon or an agent says is
// rendered as text, never as HTML.
import { $, applyPatch, button, el, entries, refreshTimes, time } from "./view.js";
import { closeThread, openThread, refreshThread, selected } from "./thread.js";
import { renderWaits } from "./waits.js";

const base = location.pathname.replace(/\/console\/?$/, "");
const TOKEN_KEY = "agui-serve-console-token";

export const state = {
  fleet: null,
  threads: [],
  nextCursor: null,
  reach: new Map(),
  operator: true,
};
let source = null;
let runSet = "";
// What each part was last drawn from: a part whose data did not change is left alone (the
// fleet changes every second while runs spend; redrawing would take the keyboard's focus).
let drawn = {};

function changed(part, data) {
  const text = JSON.stringify(data ?? null);
  if (drawn[part] === text) return false;
  drawn[part] = text;
  return true;
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function status(text, problem = false) {
  const node = $("status");
  node.textContent = text;
  node.classList.toggle("problem", problem);
}

/** A call of the daemon's API with the token; a refused token asks for it again. */
/** Says on the status line that `what` failed (a refused token says itself). */
export function failed(what, error) {
  if (error.message !== "unauthorized") status(`${what} failed: ${error.message}`, true);
}

export async function api(path, init = {}) {
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

/** `?owner=` for a principal's thread when the operator acts on it. */
export function ownerQuery(owner, joiner = "?") {
  return owner ? `${joiner}owner=${encodeURIComponent(owner)}` : "";
}

/** The live run of a thread, from the fleet. */
export function liveRun(owner, threadId) {
  for (const [, run] of entries(state.fleet && state.fleet.runs)) {
    if (run.threadId === threadId && (run.owner || "") === (owner || "")) return run;
  }
  return null;
}

/** A thread's title as the thread list knows it. */
export function titleOf(owner, threadId) {
  const thread = state.threads.find((t) => t.threadId === threadId && (t.owner || "") === (owner || ""));
  return (thread && thread.title) || threadId;
}

function principalName(owner) {
  return owner || "operator";
}

// --- runs ---------------------------------------------------------------------------

function waitLabel(kind) {
  return { approval: "approval", input: "question", budget: "budget", tool: "browser tool" }[kind] || kind;
}

function renderRuns() {
  const runs = entries(state.fleet.runs).sort(([, a], [, b]) => String(b.startedAt).localeCompare(String(a.startedAt)));
  const list = $("runs");
  list.replaceChildren();
  for (const [, run] of runs) {
    const item = el("li", undefined, {
      class: `row run ${run.phase}`,
      "data-thread": run.threadId,
      "data-owner": run.owner || "",
      "data-run": run.runId,
    });
    const open = el("button", titleOf(run.owner, run.threadId), { type: "button", class: "link title" });
    open.addEventListener("click", () => openThread(run.owner, run.threadId));
    const meta = el("div", undefined, { class: "meta" });
    meta.append(el("span", run.agent), el("span", principalName(run.owner)), el("span", run.phase, { class: `badge ${run.phase}`, "data-phase": run.phase }));
    meta.append(el("span", "started "), time(run.startedAt));
    for (const wait of run.waitingFor || []) meta.append(el("span", `waits: ${waitLabel(wait.kind)}`, { class: "badge waiting" }));
    if (run.queued) meta.append(el("span", `${run.queued} queued`, { class: "badge" }));
    const actions = el("div", undefined, { class: "actions" });
    actions.append(button("Stop", () => stopRun(run), { "aria-label": `Stop the run on ${titleOf(run.owner, run.threadId)}` }));
    item.append(open, meta, actions);
    list.append(item);
  }
  $("no-runs").hidden = runs.length > 0;
  const totals = state.fleet.totals || {};
  $("counts").textContent = `${totals.live ?? 0} live · ${totals.suspended ?? 0} waiting · ${totals.queued ?? 0} queued`;
}

export async function stopRun(run) {
  try {
    const response = await api(`/runs/${encodeURIComponent(run.runId)}/cancel`, { method: "POST" });
    if (response.status === 202) status(`Stopping the run on ${titleOf(run.owner, run.threadId)}`);
    else if (response.status === 404) status("That run had already ended.");
    else status(`The run was not stopped: HTTP ${response.status}`, true);
  } catch (error) {
    if (error.message !== "unauthorized") status(`The run was not stopped: ${error.message}`, true);
  }
}

// --- threads ------------------------------------------------------------------------

/** The thread's status as the fleet says it: its live run's phase, else idle. */
export function threadStatus(thread) {
  const run = liveRun(thread.owner, thread.threadId);
  return run ? run.phase : "idle";
}

function matches(thread) {
  const words = $("search").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const haystack = `${thread.title || ""} ${thread.threadId} ${thread.agent} ${principalName(thread.owner)}`.toLowerCase();
  if (!words.every((word) => haystack.includes(word))) return false;
  const agent = $("filter-agent").value;
  const owner = $("filter-owner").value;
  const wanted = $("filter-status").value;
  if (agent && thread.agent !== agent) return false;
  if (owner && principalName(thread.owner) !== owner) return false;
  return !wanted || threadStatus(thread) === wanted;
}

function fillChoices(select, values, everything) {
  const chosen = select.value;
  select.replaceChildren(el("option", everything, { value: "" }));
  for (const value of [...new Set(values)].sort()) select.append(el("option", value, { value }));
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : "";
}

function renderThreads() {
  fillChoices($("filter-agent"), [...state.threads.map((t) => t.agent), ...Object.keys((state.fleet && state.fleet.agents) || {})], "All agents");
  fillChoices($("filter-owner"), state.threads.map((t) => principalName(t.owner)), "Everyone");
  const list = $("threads");
  list.replaceChildren();
  let shown = 0;
  const open = selected();
  for (const thread of state.threads) {
    if (!matches(thread)) continue;
    shown += 1;
    const phase = threadStatus(thread);
    const item = el("li", undefined, {
      class: "row thread",
      "data-thread": thread.threadId,
      "data-owner": thread.owner || "",
      "data-status": phase,
    });
    if (open && open.threadId === thread.threadId && (open.owner || "") === (thread.owner || "")) item.classList.add("selected");
    const title = el("button", thread.title || thread.threadId, { type: "button", class: "link title" });
    title.addEventListener("click", () => openThread(thread.owner, thread.threadId));
    const meta = el("div", undefined, { class: "meta" });
    meta.append(el("span", thread.agent), el("span", principalName(thread.owner)), el("span", phase, { class: `badge ${phase}`, "data-phase": phase }));
    meta.append(time(thread.updatedAt), el("span", `${thread.messageCount} messages`));
    if (thread.title) meta.append(el("span", thread.threadId, { class: "id" }));
    item.append(title, meta);
    list.append(item);
  }
  $("no-threads").hidden = shown > 0;
  $("more-threads").hidden = !state.nextCursor;
}

export async function loadThreads({ more = false } = {}) {
  try {
    const cursor = more && state.nextCursor ? `&cursor=${encodeURIComponent(state.nextCursor)}` : "";
    const limit = more ? 100 : Math.min(200, Math.max(100, state.threads.length));
    const response = await api(`/threads?limit=${limit}${cursor}`);
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const body = await response.json();
    const same = (a, b) => a.threadId === b.threadId && (a.owner || "") === (b.owner || "");
    // Read again, the first page replaces what it holds; threads loaded past it stay.
    const rest = more ? state.threads : state.threads.slice(body.threads.length).filter((t) => !body.threads.some((n) => same(n, t)));
    state.threads = more ? [...rest, ...body.threads] : [...body.threads, ...rest];
    if (!more && rest.length) state.nextCursor = state.nextCursor ?? body.nextCursor ?? null;
    else state.nextCursor = body.nextCursor || null;
    renderThreads();
    if (state.fleet) {
      renderRuns();
      renderWaits();
    }
  } catch (error) {
    failed("The thread list", error);
  }
}

// --- health and cost ----------------------------------------------------------------

function renderAgents() {
  const list = $("agents");
  list.replaceChildren();
  for (const [name, agent] of entries(state.fleet.agents)) {
    const item = el("li", undefined, { "data-agent": name });
    const head = el("div", undefined, { class: "meta" });
    head.append(el("strong", name), el("span", agent.state, { class: `badge ${agent.state === "ready" ? "ok" : "problem"}` }));
    if (agent.processes) head.append(el("span", `${agent.processes.busy} busy, ${agent.processes.idle} idle processes`));
    item.append(head);
    const may = state.reach.get(name);
    if (may) {
      const hosts = [...may.relays.map((host) => `${host} (relay)`), ...may.egress.allow];
      item.append(el("div", `reaches: ${hosts.length ? hosts.join(", ") : "nothing beyond its sandbox"}`, { class: "hint" }));
    }
    const egress = agent.egress;
    if (egress && egress.denied) {
      const last = egress.lastDenied;
      const said = last ? `; last ${last.host}:${last.port} (${last.rule}) ` : "";
      const line = el("div", `egress refused ${egress.denied} time(s)${said}`, { class: "warn" });
      if (last) line.append(time(last.atMs));
      item.append(line);
    }
    for (const [limit, count] of entries(agent.breaches)) {
      if (count) item.append(el("div", `quota breached: ${limit} ${typeof count === "object" ? JSON.stringify(count) : `${count} time(s)`}`, { class: "warn" }));
    }
    list.append(item);
  }
}

function spendLine(measure, spent, limit) {
  const line = el("div", undefined, { class: "spend" });
  const shown = measure === "wall time" ? `${Math.round(spent / 1000)} s` : String(spent);
  if (limit) {
    const ceiling = measure === "wall time" ? limit * 1000 : limit;
    line.append(el("span", `${measure}: ${shown} of ${measure === "wall time" ? `${limit} s` : limit}`));
    line.append(el("meter", undefined, { min: "0", max: String(ceiling), value: String(Math.min(spent, ceiling)), "aria-label": `${measure} spent of the daily budget` }));
  } else {
    line.append(el("span", `${measure}: ${shown}`));
  }
  return line;
}

function renderPrincipals() {
  const list = $("principals");
  list.replaceChildren();
  const days = entries(state.fleet.principals);
  for (const [owner, day] of days) {
    const item = el("li", undefined, { "data-principal": principalName(owner) });
    const head = el("div", undefined, { class: "meta" });
    head.append(el("strong", principalName(owner)));
    if (day.reached) head.append(el("span", `${day.reached} budget(s) reached`, { class: "badge problem" }));
    const limits = day.limits || {};
    item.append(head, spendLine("tokens", day.spent.tokens, limits.tokens), spendLine("tool calls", day.spent.toolCalls, limits.tool_calls));
    item.append(spendLine("wall time", day.spent.wallTimeMs, limits.wall_time));
    list.append(item);
  }
  $("no-spend").hidden = days.length > 0;
}

function renderQueues() {
  const list = $("queues");
  list.replaceChildren();
  for (const [, run] of entries(state.fleet.runs)) {
    if (!run.queued) continue;
    const item = el("li");
    const open = el("button", titleOf(run.owner, run.threadId), { type: "button", class: "link" });
    open.addEventListener("click", () => openThread(run.owner, run.threadId));
    item.append(open, ` ${run.queued} waiting behind a ${run.phase} run (${principalName(run.owner)})`);
    list.append(item);
  }
  $("no-queues").hidden = list.childElementCount > 0;
}

async function loadWebhooks() {
  if (!state.operator) return;
  try {
    const response = await api("/webhooks");
    if (!response.ok) {
      state.operator = response.status !== 403 && response.status !== 404;
      $("webhooks-panel").hidden = true;
      $("schedules-panel").hidden = !state.operator && $("schedules").childElementCount === 0;
      return;
    }
    const body = await response.json();
    const list = $("webhooks");
    list.replaceChildren();
    for (const hook of body.endpoints || []) {
      const item = el("li");
      item.append(el("strong", hook.name), ` ${hook.configured ? "" : "(not configured) "}${hook.pending} pending`);
      if (hook.failing) item.append(el("span", `, ${hook.failing} failing`, { class: "warn" }));
      if (hook.lastDeliveredAt) item.append(", last delivered ", time(hook.lastDeliveredAt));
      if (hook.lastError) item.append(el("div", `last error: ${hook.lastError.message}`, { class: "warn" }));
      list.append(item);
    }
    $("webhooks-panel").hidden = list.childElementCount === 0;
  } catch (error) {
    failed("The webhooks", error);
  }
}

async function loadSchedules() {
  try {
    const response = await api("/schedules");
    if (!response.ok) return;
    const body = await response.json();
    const rows = $("schedules");
    rows.replaceChildren();
    for (const schedule of body.schedules) {
      const row = el("tr", undefined, { "data-schedule": schedule.id });
      const thread = el("td");
      const shown = schedule.threadId || schedule.lastThreadId;
      if (shown) {
        const open = el("button", titleOf(schedule.owner, shown), { type: "button", class: "link", "aria-label": `Open ${shown}` });
        open.addEventListener("click", () => openThread(schedule.owner, shown));
        thread.append(open);
      }
      if (!schedule.threadId) thread.append(el("span", " (new each time)", { class: "hint" }));
      const last = el("td");
      if (schedule.lastStatus) last.append(`${schedule.lastStatus} `, time(schedule.lastRunAt));
      else last.append("never");
      if (schedule.lastError) last.append(el("div", schedule.lastError, { class: "warn" }));
      const missed = el("td", schedule.missed.count ? `${schedule.missed.count}` : "0");
      if (schedule.missed.count) missed.append(" (last ", time(schedule.missed.last), ")");
      const actions = el("td");
      actions.append(
        button("Delete", async () => {
          const answer = await api(`/schedules/${encodeURIComponent(schedule.id)}`, { method: "DELETE" });
          if (!answer.ok) status(`Schedule ${schedule.id} not deleted: HTTP ${answer.status}`, true);
          await loadSchedules();
        }),
      );
      const next = el("td");
      next.append(time(schedule.nextRunAt));
      row.append(el("td", schedule.name || schedule.id), el("td", principalName(schedule.owner)), el("td", schedule.agent), el("td", `${schedule.cron} ${schedule.timezone}`));
      row.append(thread, next, last, missed, actions);
      rows.append(row);
    }
    $("no-schedules").hidden = body.schedules.length > 0;
  } catch (error) {
    failed("The schedules", error);
  }
}

async function loadReach() {
  try {
    const info = await (await api("/info")).json();
    state.reach = new Map();
    for (const [name, agent] of entries(info.agents)) {
      if (agent && agent.reach) state.reach.set(name, agent.reach);
    }
    drawn.agents = null;
    if (state.fleet) renderAgents();
  } catch (error) {
    failed("The agents' reach", error);
  }
}

// --- the fleet ----------------------------------------------------------------------

let reloadTimer = null;

/** The thread list, schedules and webhooks again, once, shortly after runs came or went. */
function reloadSoon() {
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(() => {
    loadThreads();
    loadSchedules();
    loadWebhooks();
  }, 250);
}

function render() {
  if (!state.fleet) return;
  const runs = changed("runs", state.fleet.runs);
  if (runs) {
    renderRuns();
    renderThreads();
    renderWaits();
    renderQueues();
  }
  if (changed("agents", state.fleet.agents)) renderAgents();
  if (changed("principals", state.fleet.principals)) renderPrincipals();
  // Runs came or went, or (`activity`) ended or a thread went between two rebuilds.
  const now = entries(state.fleet.runs)
    .map(([k, run]) => `${k}:${run.runId}`)
    .sort()
    .join(",") + JSON.stringify(state.fleet.activity || {});
  if (now !== runSet) {
    runSet = now;
    reloadSoon();
  }
  refreshThread();
}

function connect() {
  if (source) source.close();
  status("Connecting…");
  source = new EventSource(`${base}/fleet/stream?token=${encodeURIComponent(token())}`);
  source.onopen = () => status("Live");
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "STATE_SNAPSHOT") state.fleet = event.snapshot;
    else if (event.type === "STATE_DELTA" && state.fleet) state.fleet = applyPatch(state.fleet, event.delta);
    render();
  };
  source.onerror = () => {
    status("Reconnecting…", true);
    // A refused token closes the stream for good: a call of ours tells which.
    if (source && source.readyState === EventSource.CLOSED) {
      api("/info")
        .then(() => setTimeout(connect, 2000))
        .catch(() => {});
    }
  };
  $("login").hidden = true;
  $("console").hidden = false;
  $("sign-out").hidden = false;
  loadReach();
  loadThreads();
  loadWebhooks();
  loadSchedules();
}

function showLogin(message) {
  if (source) source.close();
  source = null;
  // Nothing of the previous token's view stays on the page.
  state.fleet = null;
  state.threads = [];
  state.nextCursor = null;
  runSet = "";
  drawn = {};
  for (const id of ["runs", "threads", "waits", "agents", "principals", "queues", "webhooks", "schedules", "messages"]) {
    $(id).replaceChildren();
  }
  closeThread();
  $("login").hidden = false;
  $("console").hidden = true;
  $("sign-out").hidden = true;
  status(message || "Enter the operator token.");
  $("token").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    state.operator = true;
    connect();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("Signed out.");
  });
  for (const id of ["search", "filter-agent", "filter-owner", "filter-status"]) {
    $(id).addEventListener("input", renderThreads);
  }
  $("more-threads").addEventListener("click", () => loadThreads({ more: true }));
  document.addEventListener("action-failed", (event) => failed("The action", event.detail));
  // Relative times move on; nothing is fetched for it.
  setInterval(() => refreshTimes(), 10_000);
  if (token()) connect();
  else showLogin();
});
