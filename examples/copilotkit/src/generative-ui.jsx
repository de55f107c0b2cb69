// Generative UI: the components agui-serve lets an agent show (its default catalog, see the
// daemon's docs/agents.md, "Generative UI"). Each arrives as an AG-UI activity message
// (`activityType` = the component, `content` = its props), live through ACTIVITY_SNAPSHOT
// and after a reload in the transcript; CopilotChat draws it with the renderer registered
// for its type (CopilotKitProvider's `renderActivityMessages`).
//
// The props are the agent's output, so untrusted: they are checked against the same shapes
// the daemon enforces and rendered as text only (React escapes it); nothing is read as HTML,
// a URL or a style other than the progress bar's width, a number clamped to 0..100.
import { useId, useState } from "react";
import { useAgent, useCopilotKit } from "@copilotkit/react-core/v2";
import { z } from "zod";

const text = (max) => z.string().max(max);
const choice = z.object({ id: text(128), label: text(256) }).strict();

const schemas = {
  // A command an agent runs, its output as it comes (ACTIVITY_DELTA adds each piece), then
  // how it ended (agui-serve's `terminal` activity).
  terminal: z.object({
    toolCallId: text(256),
    output: z.array(z.string()),
    exit: z.object({ exitCode: z.number().int().nullable(), signal: z.string().nullable() }).nullable(),
  }),
  // A file a tool call changed (agui-serve's `diff` activity): the text before (null for
  // a new file) and after.
  diff: z.object({
    toolCallId: text(256),
    path: text(4096),
    oldText: z.string().nullable(),
    newText: z.string(),
  }),
  approval_card: z
    .object({
      title: text(256),
      description: text(2048).optional(),
      risk: z.enum(["low", "medium", "high"]).optional(),
      actions: z.array(choice).max(8).optional(),
    })
    .strict(),
  choice_prompt: z
    .object({
      question: text(512),
      options: z.array(choice).min(1).max(20),
      multiple: z.boolean().optional(),
    })
    .strict(),
  diff_summary: z
    .object({
      summary: text(1024).optional(),
      files: z
        .array(
          z
            .object({
              path: text(1024),
              added: z.number().int().min(0).optional(),
              removed: z.number().int().min(0).optional(),
            })
            .strict(),
        )
        .max(100),
    })
    .strict(),
  progress: z
    .object({ label: text(256), percent: z.number().min(0).max(100), detail: text(1024).optional() })
    .strict(),
  metric: z
    .object({
      label: text(256),
      value: z.union([z.number(), text(64)]),
      unit: text(32).optional(),
      trend: z.enum(["up", "down", "flat"]).optional(),
    })
    .strict(),
  agent_card: z
    .object({
      name: text(128),
      status: z.enum(["idle", "working", "waiting", "done", "failed"]),
      description: text(1024).optional(),
    })
    .strict(),
};

// A component's frame: a labelled group, named by its heading.
function Frame({ type, title, className = "", children, ...rest }) {
  const id = useId();
  return (
    <div
      className={`gen-ui ${className}`}
      role="group"
      aria-labelledby={id}
      data-testid={`ui-${type}`}
      {...rest}
    >
      <div className="gen-ui-title" id={id}>
        {title}
      </div>
      {children}
    </div>
  );
}

function Progress({ content }) {
  const { label, percent, detail } = content;
  const shown = Math.round(Math.min(100, Math.max(0, percent)));
  return (
    <Frame type="progress" title={label}>
      <div className="gen-ui-progress">
        <div
          className="gen-ui-bar"
          role="progressbar"
          aria-label={label}
          aria-valuemin={0}
          aria-valuemax={100}
          aria-valuenow={percent}
          aria-valuetext={`${shown}%`}
        >
          <div className="gen-ui-fill" style={{ width: `${shown}%` }} />
        </div>
        <span className="gen-ui-percent">{shown}%</span>
      </div>
      {detail ? <p className="muted">{detail}</p> : null}
    </Frame>
  );
}

// The person's answer to a component with buttons (choice_prompt, approval_card): the first
// user message after it in the conversation. It is read from the messages, so a reload
// (the daemon's transcript) shows the same answer. `send` puts a label in the chat as the
// person's next message and runs the agent, as typing it would (after the run that showed
// the component, if it is still going).
function useAnswer(message) {
  const { agent } = useAgent();
  const { copilotkit } = useCopilotKit();
  const [sent, setSent] = useState();
  const messages = agent.messages;
  const at = messages.findIndex((m) => m.id === message.id);
  const next = at < 0 ? undefined : messages.slice(at + 1).find((m) => m.role === "user");
  const answer = next ? textOf(next.content) : sent;
  const send = async (label) => {
    if (sent !== undefined) return;
    setSent(label);
    if (agent.isRunning) await agent.activeRunCompletionPromise;
    agent.addMessage({ id: crypto.randomUUID(), role: "user", content: label });
    try {
      await copilotkit.runAgent({ agent });
    } catch {
      // The chat shows a failed run (its onError); nothing more to do here.
    }
  };
  return { answer, send };
}

// A user message's text (its content is a string, or parts of which some are text).
function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((part) => part?.type === "text" && typeof part.text === "string")
    .map((part) => part.text)
    .join(" ");
}

function ChoicePrompt({ content, message }) {
  const { question, options, multiple = false } = content;
  const { answer, send } = useAnswer(message);
  const answered = answer !== undefined;
  const chosen = new Set(answered ? (multiple ? answer.split(", ") : [answer]) : []);
  const [picked, toggle] = useToggleSet();
  return (
    <Frame type="choice_prompt" title={question} className="gen-ui-choice">
      <div className="buttons">
        {options.map((option) => {
          const on = answered ? chosen.has(option.label) : picked.has(option.id);
          return (
            <button
              key={option.id}
              type="button"
              aria-pressed={on}
              disabled={answered}
              onClick={() => (multiple ? toggle(option.id) : send(option.label))}
            >
              {option.label}
            </button>
          );
        })}
        {multiple && !answered ? (
          <button
            type="button"
            className="primary"
            disabled={picked.size === 0}
            onClick={() => send(options.filter((o) => picked.has(o.id)).map((o) => o.label).join(", "))}
          >
            Send
          </button>
        ) : null}
      </div>
      {answered ? (
        <p className="muted" data-testid="ui-answer">
          Answered: {answer}
        </p>
      ) : null}
    </Frame>
  );
}

// The options ticked (by id) on a choice_prompt that allows several, before Send.
function useToggleSet() {
  const [set, setSet] = useState(() => new Set());
  const toggle = (id) =>
    setSet((old) => {
      const next = new Set(old);
      if (next.has(id)) next.delete(id);
      else next.add(id);
      return next;
    });
  return [set, toggle];
}

function ApprovalCard({ content, message }) {
  const { title, description, risk, actions = [] } = content;
  const { answer, send } = useAnswer(message);
  const answered = answer !== undefined;
  return (
    <Frame type="approval_card" title={title} className="gen-ui-approval" data-risk={risk}>
      {risk ? <span className={`gen-ui-badge risk-${risk}`}>{risk} risk</span> : null}
      {description ? <p>{description}</p> : null}
      {actions.length ? (
        <div className="buttons">
          {actions.map((action) => (
            <button
              key={action.id}
              type="button"
              aria-pressed={answered && answer === action.label}
              disabled={answered}
              onClick={() => send(action.label)}
            >
              {action.label}
            </button>
          ))}
        </div>
      ) : null}
      {answered && actions.length ? (
        <p className="muted" data-testid="ui-answer">
          Answered: {answer}
        </p>
      ) : null}
    </Frame>
  );
}

function DiffSummary({ content }) {
  const { summary, files } = content;
  const added = files.reduce((n, f) => n + (f.added ?? 0), 0);
  const removed = files.reduce((n, f) => n + (f.removed ?? 0), 0);
  const title = `${files.length} ${files.length === 1 ? "file" : "files"} changed, +${added} −${removed}`;
  return (
    <Frame type="diff_summary" title={title}>
      {summary ? <p>{summary}</p> : null}
      {files.length ? (
        <table className="gen-ui-diff">
          <thead>
            <tr>
              <th scope="col">File</th>
              <th scope="col">Added</th>
              <th scope="col">Removed</th>
            </tr>
          </thead>
          <tbody>
            {files.map((file, i) => (
              <tr key={i}>
                <td>
                  <code>{file.path}</code>
                </td>
                <td className="added">{file.added === undefined ? "" : `+${file.added}`}</td>
                <td className="removed">{file.removed === undefined ? "" : `−${file.removed}`}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </Frame>
  );
}

const TRENDS = { up: "↑ up", down: "↓ down", flat: "→ flat" };

function Metric({ content }) {
  const { label, value, unit, trend } = content;
  return (
    <Frame type="metric" title={label} className="gen-ui-metric">
      <p className="gen-ui-value">
        <strong>{String(value)}</strong>
        {unit ? <span className="muted"> {unit}</span> : null}
        {trend ? <span className="gen-ui-trend"> {TRENDS[trend]}</span> : null}
      </p>
    </Frame>
  );
}

function AgentCard({ content }) {
  const { name, status, description } = content;
  return (
    <Frame type="agent_card" title={name} className="gen-ui-agent">
      <span className={`gen-ui-badge status-${status}`}>{status}</span>
      {description ? <p>{description}</p> : null}
    </Frame>
  );
}

// A component this page has no renderer for (a catalog can list more than the defaults):
// named, with its props as text.
function Unknown({ activityType, content }) {
  let props;
  try {
    props = JSON.stringify(content, null, 2);
  } catch {
    props = String(content);
  }
  return (
    <Frame type="unknown" title={`Component ${activityType}`} className="gen-ui-unknown">
      <p className="muted">This page has no renderer for it; its props:</p>
      <pre>{props?.slice(0, 4096)}</pre>
    </Frame>
  );
}

// A command's output, as it streams.
function Terminal({ content }) {
  const { output, exit } = content;
  const ended = exit
    ? exit.exitCode === null
      ? `ended (${exit.signal ?? "no status"})`
      : `exit ${exit.exitCode}`
    : "running…";
  return (
    <Frame type="terminal" title={`Command ${ended}`} data-ended={exit ? "true" : "false"}>
      <pre className="gen-ui-terminal" data-testid="terminal-output">
        {output.join("").slice(-65536)}
      </pre>
    </Frame>
  );
}

// One file's change: the lines removed and added (a plain line diff, enough to judge).
function FileDiff({ content }) {
  const { path, oldText, newText } = content;
  const before = (oldText ?? "").split("\n");
  const after = newText.split("\n");
  const lines = [
    ...before.filter((l) => l && !after.includes(l)).map((l) => ["removed", `- ${l}`]),
    ...after.filter((l) => l && !before.includes(l)).map((l) => ["added", `+ ${l}`]),
  ];
  return (
    <Frame type="diff" title={`${oldText === null ? "New file" : "Changed"} ${path}`}>
      <pre className="gen-ui-file-diff" data-testid="file-diff">
        {lines.slice(0, 400).map(([kind, line], i) => (
          <span key={i} className={kind}>
            {line}
            {"\n"}
          </span>
        ))}
      </pre>
    </Frame>
  );
}

const RENDERERS = {
  terminal: Terminal,
  diff: FileDiff,
  approval_card: ApprovalCard,
  choice_prompt: ChoicePrompt,
  diff_summary: DiffSummary,
  progress: Progress,
  metric: Metric,
  agent_card: AgentCard,
};

// For CopilotKitProvider's `renderActivityMessages` (a stable array: built once).
export const ACTIVITY_RENDERERS = [
  ...Object.entries(RENDERERS).map(([activityType, render]) => ({
    activityType,
    content: schemas[activityType],
    render,
  })),
  { activityType: "*", content: z.unknown(), render: Unknown },
];
