// The selected thread, in the right-hand pane: its title and facts, what can be done to it
// (stop its run, archive, delete), the files its agent changed, and its transcript. It is
// read again when the fleet says its run started, changed phase or ended.
import { api, liveRun, loadThreads, ownerQuery, state, status, stopRun, titleOf } from "./app.js";
import { $, button, el, time, transcriptView } from "./view.js";

let current = null;
let seen = "";
// Each read of the pane is numbered; an older read that answers late is dropped.
let generation = 0;

export function selected() {
  return current;
}

function runMark(run) {
  return run ? `${run.runId}:${run.phase}:${(run.waitingFor || []).length}` : "none";
}

/** Opens `owner`'s thread `threadId` in the pane and brings the pane into view. */
export async function openThread(owner, threadId) {
  current = { owner: owner || "", threadId };
  seen = runMark(liveRun(owner, threadId));
  for (const row of document.querySelectorAll("#threads li.selected")) row.classList.remove("selected");
  await load();
  const heading = $("detail-title");
  heading.focus({ preventScroll: true });
  $("detail").scrollIntoView({ block: "start", behavior: "instant" });
}

/** After a fleet change: the open thread again when its run changed. */
export function refreshThread() {
  if (!current) return;
  const mark = runMark(liveRun(current.owner, current.threadId));
  if (mark !== seen) {
    seen = mark;
    load();
  }
}

export function closeThread() {
  current = null;
  generation += 1;
  $("detail-body").hidden = true;
  $("detail-empty").hidden = false;
}

async function load() {
  try {
    await read();
  } catch (error) {
    if (error.message !== "unauthorized") status(`The thread could not be read: ${error.message}`, true);
  }
}

async function read() {
  if (!current) return;
  const mine = ++generation;
  const { owner, threadId } = current;
  const query = ownerQuery(owner);
  const path = `/threads/${encodeURIComponent(threadId)}`;
  const [meta, messages] = await Promise.all([api(`${path}${query}`), api(`${path}/messages${query}`)]);
  if (mine !== generation) return;
  if (!meta.ok || !messages.ok) {
    status(`Thread ${threadId} could not be read: HTTP ${meta.ok ? messages.status : meta.status}`, true);
    closeThread();
    return;
  }
  const thread = await meta.json();
  const body = await messages.json();
  if (mine !== generation) return;
  $("detail-empty").hidden = true;
  $("detail-body").hidden = false;
  $("detail-title").textContent = thread.title || titleOf(owner, threadId);
  const facts = $("detail-meta");
  facts.replaceChildren();
  const run = liveRun(owner, threadId);
  const phase = run ? run.phase : "idle";
  facts.append(el("span", thread.agent), el("span", owner || "operator"), el("span", phase, { class: `badge ${phase}` }));
  facts.append(el("span", "created "), time(thread.createdAt), el("span", "updated "), time(thread.updatedAt));
  facts.append(el("span", threadId, { class: "id" }));
  if (thread.lastRun && !run) facts.append(el("span", `last run ${thread.lastRun.outcome || ""}`));
  renderActions(thread, run);
  // Only an agent with a session (an ACP agent) has a workspace to look at.
  renderFiles(thread.sessionId ? path : null, query);
  const list = $("messages");
  list.replaceChildren(transcriptView(body.messages));
  if (body.truncated) list.prepend(el("li", "Earlier messages are not shown.", { class: "hint" }));
  for (const row of document.querySelectorAll("#threads li")) {
    row.classList.toggle("selected", row.dataset.thread === threadId && row.dataset.owner === owner);
  }
}

function renderActions(thread, run) {
  const { owner, threadId } = current;
  const query = ownerQuery(owner);
  const path = `/threads/${encodeURIComponent(threadId)}`;
  const actions = $("detail-actions");
  actions.replaceChildren();
  if (run) actions.append(button("Stop run", () => stopRun(run), { class: "danger" }));
  actions.append(
    button("Archive", async () => {
      const response = await api(`${path}/archive${query}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: "{}",
      });
      if (!response.ok) return status(`Not archived: HTTP ${response.status}`, true);
      status(`Archived ${thread.title || threadId}`);
      closeThread();
      await loadThreads();
    }),
  );
  // Deleting asks twice: the first press arms the button for a few seconds.
  const remove = el("button", "Delete", { type: "button", class: "danger" });
  let armed = null;
  remove.addEventListener("click", async () => {
    if (!armed) {
      remove.textContent = "Delete for good?";
      armed = setTimeout(() => {
        armed = null;
        remove.textContent = "Delete";
      }, 4000);
      return;
    }
    clearTimeout(armed);
    remove.disabled = true;
    const response = await api(`${path}${query}`, { method: "DELETE" });
    if (response.status !== 204) {
      remove.disabled = false;
      return status(`Not deleted: HTTP ${response.status}`, true);
    }
    status(`Deleted ${thread.title || threadId}`);
    state.threads = state.threads.filter((t) => !(t.threadId === threadId && (t.owner || "") === owner));
    closeThread();
    await loadThreads();
  });
  actions.append(remove, button("Close", async () => closeThread()));
}

async function renderFiles(path, query) {
  const list = $("detail-files");
  list.replaceChildren();
  $("detail-files-head").hidden = true;
  if (!path) return;
  try {
    const response = await api(`${path}/workspace/changes${query}`);
    if (!response.ok) return;
    const { changes } = await response.json();
    for (const file of (changes && changes.files) || []) {
      const item = el("li");
      item.append(el("span", file.path, { class: "path" }), ` ${file.status}`);
      if (file.added !== undefined) item.append(el("span", ` +${file.added}`, { class: "added" }), el("span", ` -${file.removed}`, { class: "removed" }));
      list.append(item);
    }
    $("detail-files-head").hidden = list.childElementCount === 0;
  } catch {
    // A thread with no workspace shows no files.
  }
}
