// "Waiting for you": every run the fleet shows waiting on a person, as a card with what
// there is to decide (the tool and its input, the diff it would apply, the form, the budget
// reached) and the answers. What a wait asks is read from the thread's reattach stream,
// which replays a suspended run's segment: its messages, then `RUN_FINISHED` with the
// pending tool calls or interrupts. The answer goes to the run route as any client's
// would (a tool message, or a `resume[]`; the stored history stands for the rest), so the
// run keeps its own semantics (its budget questions, its disconnect grace); the answer's
// stream is read to its end.
import { api, ownerQuery, state, status, stopRun, titleOf } from "./app.js";
import { $, button, diffView, el, entries, pretty, time } from "./view.js";

const cards = new Map();
const KIND_TITLE = { approval: "Approval", input: "Question", budget: "Budget reached", tool: "Browser tool" };

export function renderWaits() {
  const wanted = new Map();
  for (const [, run] of entries(state.fleet.runs)) {
    for (const wait of run.waitingFor || []) wanted.set(`${run.runId}/${wait.id}`, { run, wait });
  }
  for (const [id, card] of cards) {
    if (!wanted.has(id)) {
      card.remove();
      cards.delete(id);
    }
  }
  const list = $("waits");
  for (const [id, { run, wait }] of wanted) {
    if (cards.has(id)) {
      // The thread list may have learnt the title since.
      cards.get(id).querySelector("h3").textContent = heading(run, wait);
      continue;
    }
    const card = el("article", undefined, { class: `wait ${wait.kind}`, "data-wait": wait.id, "data-thread": run.threadId, "data-kind": wait.kind });
    const head = el("header");
    head.append(el("h3", heading(run, wait)));
    const meta = el("div", undefined, { class: "meta" });
    meta.append(el("span", run.agent), el("span", run.owner || "operator"), el("span", "started "), time(run.startedAt));
    head.append(meta);
    const body = el("div", "Reading what it asks…", { class: "hint" });
    card.append(head, body);
    list.append(card);
    cards.set(id, card);
    describe(run, wait, body);
  }
  $("waiting-count").textContent = wanted.size ? String(wanted.size) : "";
  $("nothing-waiting").hidden = wanted.size > 0;
}

function heading(run, wait) {
  return `${KIND_TITLE[wait.kind] || wait.kind}: ${titleOf(run.owner, run.threadId)}`;
}

/** The suspended segment of `run`'s thread, replayed: its messages and its end. */
async function segment(run) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 8000);
  try {
    const response = await api(`/threads/${encodeURIComponent(run.threadId)}/stream${ownerQuery(run.owner)}`, {
      headers: { Accept: "text/event-stream" },
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let messages = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trimStart())
          .join("\n");
        if (!data) continue;
        const event = JSON.parse(data);
        if (event.type === "MESSAGES_SNAPSHOT") messages = event.messages;
        if (event.type === "RUN_FINISHED" || event.type === "RUN_ERROR") {
          controller.abort();
          return { messages, outcome: event.outcome || {} };
        }
      }
    }
    return { messages, outcome: {} };
  } finally {
    clearTimeout(timer);
  }
}

/** What the wait asks, the same whichever way the agent asks (tool call or interrupt). */
function question(wait, { messages, outcome }) {
  const interrupt = (outcome.interrupts || []).find((i) => i.id === wait.id);
  if (interrupt) {
    const meta = interrupt.metadata || {};
    return {
      mode: "interrupt",
      message: interrupt.message,
      options: meta.options || [],
      toolCallId: interrupt.toolCallId,
      toolCall: meta.toolCall,
      schema: interrupt.responseSchema,
      budget: interrupt.reason === "budget_reached" ? meta : null,
      messages,
    };
  }
  const call = messages.flatMap((m) => m.toolCalls || []).find((c) => c.id === wait.id);
  let args = {};
  try {
    args = JSON.parse((call && call.function.arguments) || "{}");
  } catch {
    // Shown as it is below.
  }
  return {
    mode: "tool",
    name: call && call.function.name,
    arguments: call && call.function.arguments,
    message: args.title || args.message,
    options: args.options || [],
    toolCallId: args.toolCallId,
    toolCall: args.toolCall,
    schema: args.schema,
    budget: args.reason === "budget_reached" ? args : null,
    messages,
  };
}

async function describe(run, wait, body) {
  try {
    ask(run, wait, body, question(wait, await segment(run)));
  } catch (error) {
    body.className = "hint";
    body.textContent = `What it asks could not be read (${error.message}).`;
  }
}

function ask(run, wait, body, asked) {
  body.className = "ask";
  body.replaceChildren();
  if (asked.message) body.append(el("p", asked.message, { class: "question" }));
  if (wait.kind === "tool") {
    body.append(el("p", `The run waits for the browser page that started it to run the tool ${asked.name || ""} and send its result. Nothing here can answer it; it goes on when the page answers, or ends when the wait times out.`, { class: "hint" }));
    if (asked.arguments) body.append(el("pre", pretty(asked.arguments)));
    body.append(actions([button("Stop the run", () => stopRun(run), { class: "danger" })]));
    return;
  }
  if (wait.kind === "budget") {
    const b = asked.budget || {};
    body.append(el("p", `The ${b.budget || "run"}'s ${b.measure || ""} budget of ${b.limit ?? "?"} is reached (${b.spent ?? "?"} spent). Extending doubles it once.`));
  }
  if (asked.toolCall) {
    const call = asked.toolCall;
    body.append(el("p", `${call.name || "tool"}${call.kind ? ` (${call.kind})` : ""}`, { class: "tool-name" }));
    if (call.input !== undefined) body.append(el("pre", pretty(call.input)));
  }
  for (const message of asked.messages) {
    const content = message.content;
    if (message.role === "activity" && message.activityType === "diff" && content && content.toolCallId === asked.toolCallId && asked.toolCallId) {
      body.append(diffView(content));
    }
  }
  if (wait.kind === "input") {
    body.append(form(run, wait, asked));
    return;
  }
  const choices = asked.options.map((option) => {
    const allow = /^allow/.test(option.kind || "") || option.optionId === "extend";
    return button(option.name || option.optionId, () => answer(run, wait, asked, { optionId: option.optionId }), { class: allow ? "primary" : "danger" });
  });
  body.append(actions(choices));
}

function actions(nodes) {
  const box = el("div", undefined, { class: "actions" });
  box.append(...nodes);
  return box;
}

/** A form from a flat JSON Schema: text, numbers, yes/no, one of a list. */
function form(run, wait, asked) {
  const node = el("form", undefined, { class: "answer-form" });
  const schema = asked.schema || {};
  const required = new Set(schema.required || []);
  const fields = [];
  for (const [name, field] of entries(schema.properties).filter(([, f]) => f && typeof f === "object")) {
    const id = `f-${wait.id}-${name}`.replace(/[^A-Za-z0-9_-]/g, "_");
    const label = el("label", field.title || name, { for: id });
    let input;
    if (Array.isArray(field.enum)) {
      input = el("select", undefined, { id });
      for (const value of field.enum) input.append(el("option", value, { value: String(value) }));
    } else if (field.type === "boolean") {
      input = el("input", undefined, { id, type: "checkbox" });
    } else {
      const numeric = field.type === "number" || field.type === "integer";
      input = el("input", undefined, { id, type: numeric ? "number" : "text", required: required.has(name) });
    }
    fields.push({ name, field, input });
    const row = el("div", undefined, { class: "field" });
    row.append(label, input);
    if (field.description) row.append(el("div", field.description, { class: "hint" }));
    node.append(row);
  }
  node.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = {};
    for (const { name, field, input } of fields) {
      if (field.type === "boolean") values[name] = input.checked;
      else if (input.value === "") continue;
      else if (field.type === "number") values[name] = Number(input.value);
      else if (field.type === "integer") values[name] = Number.parseInt(input.value, 10);
      else if (Array.isArray(field.enum) && typeof field.enum[0] === "number") values[name] = Number(input.value);
      else values[name] = input.value;
    }
    answer(run, wait, asked, { values });
  });
  const send = el("button", "Send answer", { type: "submit", class: "primary" });
  node.append(actions([send, button("Decline", () => answer(run, wait, asked, { decline: true }))]));
  return node;
}

/** Posts the answer: a tool message (tool mode) or a `resume[]` (interrupt mode). */
async function answer(run, wait, asked, { optionId, values, decline }) {
  const messages = [];
  const input = { threadId: run.threadId, runId: crypto.randomUUID(), protocolVersion: "1.0", messages };
  if (asked.mode === "tool") {
    let content;
    if (optionId !== undefined) content = { optionId };
    else content = decline ? { action: "decline" } : { action: "accept", content: values };
    messages.push({ id: crypto.randomUUID(), role: "tool", toolCallId: wait.id, content: JSON.stringify(content) });
  } else if (decline) {
    input.resume = [{ interruptId: wait.id, status: "cancelled" }];
  } else {
    input.resume = [{ interruptId: wait.id, status: "resolved", payload: optionId !== undefined ? { optionId } : values }];
  }
  try {
    const response = await api(`/${encodeURIComponent(run.agent)}${ownerQuery(run.owner)}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(input),
    });
    if (!response.ok) {
      let said = "";
      try {
        said = (await response.json()).message || "";
      } catch {
        // No JSON body.
      }
      status(`The answer was refused: HTTP ${response.status} ${said}`, true);
      return;
    }
    status(`Answered ${titleOf(run.owner, run.threadId)}`);
    // Followed to its end (the fleet shows how it goes), so the answer is never abandoned.
    const reader = response.body.getReader();
    while (!(await reader.read()).done) {
      // Nothing to do with the events here.
    }
  } catch (error) {
    if (error.message !== "unauthorized") status(`The answer failed: ${error.message}`, true);
  }
}

