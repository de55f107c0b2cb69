// What the console draws, with no state of its own: elements built as text (never HTML),
// relative times, the fleet document's patches, line diffs, and a thread's transcript with
// its tool calls, diffs and terminal output.

export const $ = (id) => document.getElementById(id);

/** An element with `text` as its text and `attrs` as attributes. */
export function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value === true ? "" : value);
  }
  return node;
}

/**
 * A button that runs `action` when pressed (disabled while it runs); an action that fails
 * raises `action-failed` on the document with the error.
 */
export function button(text, action, attrs = {}) {
  const node = el("button", text, { type: "button", ...attrs });
  node.addEventListener("click", async () => {
    node.disabled = true;
    try {
      await action(node);
    } catch (error) {
      document.dispatchEvent(new CustomEvent("action-failed", { detail: error }));
    } finally {
      node.disabled = false;
    }
  });
  return node;
}

// Relative times: "12 s ago", "in 3 min". Each element carrying `data-time` (epoch ms) is
// rewritten by `refreshTimes`; its `title` keeps the absolute time.
const UNITS = [
  [86_400_000, "d"],
  [3_600_000, "h"],
  [60_000, "min"],
  [1_000, "s"],
];

export function relative(ms, now = Date.now()) {
  const delta = ms - now;
  const size = Math.abs(delta);
  if (size < 2_000) return "just now";
  for (const [unit, name] of UNITS) {
    if (size >= unit) {
      const count = Math.floor(size / unit);
      return delta < 0 ? `${count} ${name} ago` : `in ${count} ${name}`;
    }
  }
  return "just now";
}

export function time(value) {
  const ms = typeof value === "number" ? value : Date.parse(value);
  if (!Number.isFinite(ms)) return el("span", "");
  return el("time", relative(ms), { "data-time": String(ms), datetime: new Date(ms).toISOString(), title: new Date(ms).toLocaleString() });
}

export function refreshTimes(root = document) {
  const now = Date.now();
  for (const node of root.querySelectorAll("[data-time]")) {
    node.textContent = relative(Number(node.dataset.time), now);
  }
}

// RFC 6902, the operations the daemon's diffs use (add, remove, replace). Keys are a
// client's thread ids: every one (`__proto__` too) is read and written as an own property,
// never through the prototype.
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

export function applyPatch(doc, ops) {
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

/** Object entries that are the object's own (a thread named `__proto__` is one). */
export function entries(object) {
  return object ? Object.keys(object).map((key) => [key, object[key]]) : [];
}

// Line diffs: the longest common subsequence of the lines (bounded; past the bound the
// whole old text is shown removed and the new added).
const DIFF_CELLS = 250_000;

export function lineDiff(oldText, newText) {
  const a = oldText ? oldText.replace(/\n$/, "").split("\n") : [];
  const b = newText ? newText.replace(/\n$/, "").split("\n") : [];
  if (a.length * b.length > DIFF_CELLS) {
    return [...a.map((line) => ["-", line]), ...b.map((line) => ["+", line])];
  }
  const rows = a.length + 1;
  const cols = b.length + 1;
  const common = new Uint32Array(rows * cols);
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i * cols + j] = a[i] === b[j] ? common[(i + 1) * cols + j + 1] + 1 : Math.max(common[(i + 1) * cols + j], common[i * cols + j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      out.push([" ", a[i]]);
      i++;
      j++;
    } else if (i < a.length && (j === b.length || common[(i + 1) * cols + j] >= common[i * cols + j + 1])) {
      out.push(["-", a[i]]);
      i++;
    } else {
      out.push(["+", b[j]]);
      j++;
    }
  }
  return out;
}

/** A diff of one file: its path, lines added and removed, and the lines. */
export function diffView({ path, oldText, newText }) {
  const lines = lineDiff(oldText ?? "", newText ?? "");
  const added = lines.filter(([mark]) => mark === "+").length;
  const removed = lines.filter(([mark]) => mark === "-").length;
  const box = el("figure", undefined, { class: "diff" });
  const caption = el("figcaption");
  caption.append(el("span", path || "(no path)", { class: "path" }), el("span", ` +${added}`, { class: "added" }), el("span", ` -${removed}`, { class: "removed" }));
  const pre = el("pre");
  for (const [mark, line] of lines) {
    const kind = mark === "+" ? "add" : mark === "-" ? "del" : "same";
    pre.append(el("span", `${mark} ${line}\n`, { class: kind }));
  }
  box.append(caption, pre);
  return box;
}

/** A terminal's output and exit. */
export function terminalView(content) {
  const box = el("figure", undefined, { class: "terminal" });
  const exit = content.exit;
  let said = "running";
  if (exit) said = exit.signal ? `killed by ${exit.signal}` : `exit code ${exit.exitCode}`;
  box.append(el("figcaption", `terminal, ${said}`), el("pre", (content.output || []).join("")));
  return box;
}

export function pretty(text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

/** A block of text that folds away when long. */
function folded(label, text, open = false) {
  const box = el("details", undefined, { class: "block" });
  if (open || text.length < 400) box.open = true;
  box.append(el("summary", label), el("pre", text));
  return box;
}

function partsText(content) {
  if (typeof content === "string") return [content];
  if (!Array.isArray(content)) return content === undefined || content === null ? [] : [JSON.stringify(content)];
  return content.map((part) => {
    if (part.type === "text") return part.text;
    if (part.type === "image" || part.type === "binary") return part;
    return `[${part.type}]`;
  });
}

function contentView(content) {
  const box = el("div", undefined, { class: "text" });
  for (const part of partsText(content)) {
    if (typeof part === "string") {
      box.append(el("p", part));
      continue;
    }
    const source = part.source || {};
    const url = source.type === "data" ? `data:${source.mimeType};base64,${source.value}` : part.data ? `data:${part.mimeType};base64,${part.data}` : null;
    if (url && /^image\//.test(source.mimeType || part.mimeType || "")) {
      box.append(el("img", undefined, { src: url, alt: part.filename || "an image in the message", class: "image" }));
    } else {
      box.append(el("p", `[image ${source.mimeType || part.mimeType || ""}${part.filename ? ` ${part.filename}` : ""}]`, { class: "hint" }));
    }
  }
  return box;
}

/**
 * A transcript as a timeline: each message with its role; an assistant's tool calls with
 * their input, the diffs and terminal output reported for them and their result.
 */
export function transcriptView(messages) {
  const list = document.createDocumentFragment();
  const results = new Map();
  const activities = new Map();
  for (const message of messages) {
    if (message.role === "tool") results.set(message.toolCallId, message);
    const call = message.role === "activity" && message.content && message.content.toolCallId;
    if (call) {
      if (!activities.has(call)) activities.set(call, []);
      activities.get(call).push(message);
    }
  }
  const shown = new Set();
  for (const message of messages) {
    if (message.role === "tool" && shown.has(message.toolCallId)) continue;
    if (message.role === "activity" && message.content && shown.has(message.content.toolCallId)) continue;
    const item = el("li", undefined, { class: `message ${message.role}`, "data-role": message.role });
    item.append(el("span", roleName(message), { class: "role" }));
    if (message.role === "activity") {
      item.append(activityView(message));
    } else if (message.role === "reasoning") {
      item.append(folded("reasoning", String(message.content ?? "")));
    } else if (message.content !== undefined && message.content !== null && message.content !== "") {
      item.append(contentView(message.content));
    }
    for (const call of message.toolCalls || []) {
      shown.add(call.id);
      item.append(toolCallView(call, activities.get(call.id) || [], results.get(call.id)));
    }
    list.append(item);
  }
  return list;
}

function roleName(message) {
  if (message.role === "activity") return message.activityType || "activity";
  return message.role;
}

function activityView(message) {
  if (message.activityType === "diff") return diffView(message.content);
  if (message.activityType === "terminal") return terminalView(message.content);
  return folded(message.activityType || "activity", pretty(message.content), false);
}

export function toolCallView(call, activities, result) {
  const box = el("section", undefined, { class: "tool-call", "data-tool-call": call.id });
  box.append(el("h4", call.function.name));
  box.append(folded("input", pretty(call.function.arguments || "")));
  for (const activity of activities) box.append(activityView(activity));
  if (result) box.append(folded(result.error ? "error" : "result", String(typeof result.content === "string" ? result.content : JSON.stringify(result.content))));
  else box.append(el("p", "no result yet", { class: "hint" }));
  return box;
}
