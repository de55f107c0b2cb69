import { createContext, useContext, useEffect, useMemo, useState } from "react";
import {
  CopilotChat,
  CopilotChatAssistantMessage,
  CopilotChatUserMessage,
  CopilotKitProvider,
  CopilotThreadsDrawer,
  useAgent,
  useCopilotKit,
  useFrontendTool,
  useHumanInTheLoop,
} from "@copilotkit/react-core/v2";
import { z } from "zod";
import { ACTIVITY_RENDERERS } from "./generative-ui.jsx";

// The conversation's thread lives in the URL (?thread=...), so a reload, a bookmark or a
// second tab comes back to the same thread; its history is restored from agui-serve.
function threadFromUrl() {
  const url = new URL(window.location.href);
  let thread = url.searchParams.get("thread");
  if (!thread) {
    thread = crypto.randomUUID();
    url.searchParams.set("thread", thread);
    window.history.replaceState(null, "", url);
  }
  return thread;
}

// Two ways to reach agui-serve, chosen when the page is built:
// - through the CopilotKit runtime of server.mjs (`/api/copilotkit`, agent `default`);
// - direct: VITE_RUNTIME_URL=/agui VITE_AGENT_ID=demo, the daemon's own CopilotKit routes
//   behind a proxy that serves this page and adds the token (examples/reverse-proxy).
const RUNTIME_URL = import.meta.env.VITE_RUNTIME_URL ?? "/api/copilotkit";
// ?agent=NAME picks another of the daemon's agents (direct mode).
const AGENT_ID =
  new URL(window.location.href).searchParams.get("agent") ?? import.meta.env.VITE_AGENT_ID ?? "default";
// In direct mode the daemon serves CopilotKit's threads (`{path}/threads`: the list, rename,
// archive, delete) and uploads (`{path}/uploads`).
const DIRECT = import.meta.env.VITE_RUNTIME_URL !== undefined;

// A page of this app on thread `thread` (a new one when absent), keeping ?agent=.
function pageFor(thread) {
  const url = new URL(window.location.href);
  url.search = "";
  const agent = new URL(window.location.href).searchParams.get("agent");
  if (agent) url.searchParams.set("agent", agent);
  if (thread) url.searchParams.set("thread", thread);
  return url.toString();
}

// Attachments go to the daemon's uploads route; the message carries the upload's URL,
// which the daemon reads into the agent's prompt.
const ATTACHMENTS = {
  enabled: true,
  onUpload: async (file) => {
    const response = await fetch(
      `${RUNTIME_URL}/uploads?filename=${encodeURIComponent(file.name)}`,
      { method: "POST", headers: { "Content-Type": file.type || "application/octet-stream" }, body: file },
    );
    const upload = await response.json();
    if (!response.ok) throw new Error(upload.message ?? `upload failed: ${response.status}`);
    // Its link that needs no token (an <img> sends none): CopilotKit shows it, and the
    // daemon keeps the plain URL and shows the thread again with fresh links.
    return { type: "url", value: upload.previewUrl, mimeType: upload.contentType };
  },
};

export function App() {
  const threadId = useMemo(threadFromUrl, []);
  return (
    <CopilotKitProvider
      runtimeUrl={RUNTIME_URL}
      showDevConsole={false}
      renderActivityMessages={ACTIVITY_RENDERERS}
    >
      <Tools />
      <div className={DIRECT ? "layout with-drawer" : "layout"}>
        {DIRECT ? (
          <CopilotThreadsDrawer
            agentId={AGENT_ID}
            onThreadSelect={(id) => window.location.assign(pageFor(id))}
            onNewThread={() => window.location.assign(pageFor(null))}
          />
        ) : null}
        <Chat threadId={threadId} />
        <aside className="side">
          <TodoPanel />
          {DIRECT ? <RenameThread current={threadId} /> : null}
        </aside>
      </div>
    </CopilotKitProvider>
  );
}

// What the page adds to the conversation, by the id of the message it follows: a run's
// error (as it happens; after a reload the daemon's transcript holds it, see
// isRecordedError) and the "stopped" marker of a reply the person stopped.
const Notes = createContext({ errors: new Map(), stopped: new Set() });

// Edit and regenerate: the page sends the conversation as it should be from then on, and
// says it owns that history (forwardedProps.agui.history = "client"), so agui-serve rewinds
// the thread (its transcript, and an agent's files where it keeps checkpoints) to where
// the two part, then runs.
const Edits = createContext({});

function Chat({ threadId }) {
  const { agent } = useAgent({ agentId: AGENT_ID });
  const { copilotkit } = useCopilotKit();
  // A run that ends in RUN_ERROR (the agent failed, the daemon is unreachable, the run was
  // refused) is shown to the person, not only logged: in the banner and in the
  // conversation, after the message that started the run.
  const [error, setError] = useState(null);
  const [notes, setNotes] = useState(() => ({ errors: new Map(), stopped: new Set() }));
  const lastMessageId = () => agent.messages[agent.messages.length - 1]?.id;
  const onError = ({ error: failure, context }) => {
    if (context?.runtimeErrorCode === "cancelled") return; // a stop, marked as such
    setError(failure.message);
    const anchor = lastMessageId();
    if (anchor)
      setNotes((n) => ({ ...n, errors: new Map(n.errors).set(anchor, failure.message) }));
  };
  // The stop button: the reply so far stays, marked as stopped.
  const onStop = () => {
    if (!agent.isRunning) return;
    const anchor = lastMessageId();
    if (anchor) setNotes((n) => ({ ...n, stopped: new Set(n.stopped).add(anchor) }));
    copilotkit.stopAgent({ agent });
  };
  // The daemon pushes no thread changes to CopilotKit's threads UI: its list is read again
  // when a run ends, so a new thread (or a title set by the agent) shows at once.
  useEffect(() => {
    if (!DIRECT) return undefined;
    const subscription = agent.subscribe({
      onRunFinalized: () => copilotkit.getThreadStore?.(AGENT_ID)?.refetchThreads(),
    });
    return () => subscription.unsubscribe();
  }, [agent, copilotkit]);
  const edits = useMemo(() => {
    const rerun = (messages) => {
      if (agent.isRunning) return;
      agent.setMessages(messages);
      copilotkit.runAgent({ agent, forwardedProps: { agui: { history: "client" } } }).catch(() => {});
    };
    return {
      // Regenerate an answer: the conversation up to the question it answered, asked again.
      onRegenerate: (message) => {
        const at = agent.messages.findIndex((m) => m.id === message.id);
        let question = at;
        while (question >= 0 && agent.messages[question].role !== "user") question -= 1;
        if (question >= 0) rerun(agent.messages.slice(0, question + 1));
      },
      // Edit a question: the conversation before it, then the question as edited.
      onEditMessage: ({ message }) => {
        const before = typeof message.content === "string" ? message.content : "";
        const text = window.prompt("Edit your message", before);
        if (text == null || text.trim() === "" || text === before) return;
        const at = agent.messages.findIndex((m) => m.id === message.id);
        if (at < 0) return;
        rerun([...agent.messages.slice(0, at), { id: crypto.randomUUID(), role: "user", content: text }]);
      },
    };
  }, [agent, copilotkit]);
  const empty = agent.messages.length === 0 && !agent.isRunning;
  return (
    <section className="chat" aria-label="Chat">
      {error ? (
        <div className="error" role="alert" data-testid="run-error">
          <span>{error}</span>
          <button type="button" onClick={() => setError(null)}>
            Dismiss
          </button>
        </div>
      ) : null}
      {empty ? <Welcome /> : null}
      {/* The chat fills what the banner and the hint leave, so its input stays on screen. */}
      <div className="chat-body">
        <Notes.Provider value={notes}>
          <Edits.Provider value={edits}>
          <CopilotChat
            agentId={AGENT_ID}
            threadId={threadId}
            labels={{ chatInputPlaceholder: "Message the agent…" }}
            onError={onError}
            onStop={onStop}
            messageView={MESSAGE_VIEW}
            attachments={DIRECT ? ATTACHMENTS : undefined}
          />
          </Edits.Provider>
        </Notes.Provider>
      </div>
    </section>
  );
}

// The first screen: what the demo agent understands.
const COMMANDS = [
  ["hello", "plain text is echoed back"],
  ["/slow 10 300", "10 chunks, one every 300 ms (try the stop button)"],
  ["/think why is the sky blue", "a reasoning block, then the reply"],
  ["/todo plan; build; ship", "fills the todos panel from shared state"],
  ['/tool show_card {"title":"Hi","body":"from the agent"}', "a frontend tool the page renders"],
  ["/approve deploy", "asks for your approval first"],
  ['/ui progress {"label":"Indexing","percent":42}', "a component the agent shows, drawn by the page"],
  ["/fail the disk is full", "a run that ends in an error"],
];

function Welcome() {
  return (
    <div className="welcome" data-testid="welcome">
      <h1>Talk to the demo agent</h1>
      <p className="muted">It runs in agui-serve; try one of these:</p>
      <ul>
        {COMMANDS.map(([command, what]) => (
          <li key={command}>
            <code>{command}</code> <span className="muted">{what}</span>
          </li>
        ))}
      </ul>
    </div>
  );
}

// The daemon records a failed run in the transcript as an assistant message
// `{id: "<runId>-error", content: "Error: <message>"}`; the page shows it as an error.
function isRecordedError(message) {
  return (
    message.id.endsWith("-error") &&
    typeof message.content === "string" &&
    message.content.startsWith("Error: ")
  );
}

function RunError({ text }) {
  return (
    <div className="inline-error" role="status" data-testid="inline-error">
      <strong>The run failed:</strong> {text}
    </div>
  );
}

function NotesAfter({ id }) {
  const { errors, stopped } = useContext(Notes);
  return (
    <>
      {stopped.has(id) ? (
        <div className="stopped" data-testid="stopped">
          stopped
        </div>
      ) : null}
      {errors.has(id) ? <RunError text={errors.get(id)} /> : null}
    </>
  );
}

function AssistantMessage(props) {
  const { onRegenerate } = useContext(Edits);
  if (isRecordedError(props.message))
    return <RunError text={props.message.content.slice("Error: ".length)} />;
  return (
    <>
      <CopilotChatAssistantMessage {...props} onRegenerate={props.isRunning ? undefined : onRegenerate} />
      <NotesAfter id={props.message.id} />
    </>
  );
}

function UserMessage(props) {
  const { onEditMessage } = useContext(Edits);
  return (
    <>
      <CopilotChatUserMessage {...props} onEditMessage={onEditMessage} />
      <NotesAfter id={props.message.id} />
    </>
  );
}

const MESSAGE_VIEW = { assistantMessage: AssistantMessage, userMessage: UserMessage };

// The agent's todos arrive as shared state (STATE_SNAPSHOT, then RFC 6902 STATE_DELTA).
function TodoPanel() {
  const { agent } = useAgent({ agentId: AGENT_ID });
  const todos = Array.isArray(agent.state?.todos) ? agent.state.todos : [];
  return (
    <section className="todos" aria-label="Todos" data-testid="todos">
      <h2>Todos</h2>
      {todos.length === 0 ? (
        <p className="muted">No todos yet. Try <code>/todo plan; build; ship</code>.</p>
      ) : (
        <ul>
          {todos.map((todo, i) => (
            <li key={i} data-status={todo.status}>
              <span className="status">{todo.status.replace("_", " ")}</span> {todo.content}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

// The agent's threads, newest first, from the daemon's thread list; each one a link that
// opens it (its history comes back through connect).
// Renames the current thread through the threads drawer's own store (CopilotKit's
// `renameThread`: `PATCH {path}/threads/{id}`); the drawer archives and deletes.
function RenameThread({ current }) {
  const { copilotkit } = useCopilotKit();
  const [name, setName] = useState("");
  const onSubmit = async (event) => {
    event.preventDefault();
    const store = copilotkit.getThreadStore?.(AGENT_ID);
    if (!name.trim() || !store) return;
    await store.renameThread(current, name.trim());
    setName("");
  };
  return (
    <form className="rename" onSubmit={onSubmit} data-testid="rename-thread">
      <label>
        Rename this thread
        <input value={name} onChange={(e) => setName(e.target.value)} placeholder="A name" />
      </label>
      <button type="submit">Rename</button>
    </form>
  );
}

const cardArgs = z.object({
  title: z.string().describe("The card's heading"),
  body: z.string().optional().describe("Text under the heading"),
});

const permissionArgs = z.object({
  title: z.string(),
  toolCallId: z.string().optional(),
  options: z.array(z.object({ optionId: z.string(), name: z.string(), kind: z.string() })),
  // What the agent's call is about (agui-serve): its name, kind, input and diffs.
  toolCall: z
    .object({
      name: z.string(),
      kind: z.string().optional(),
      input: z.unknown().optional(),
      diff: z
        .array(z.object({ path: z.string(), oldText: z.string().nullable(), newText: z.string() }))
        .optional(),
    })
    .optional(),
});

function Tools() {
  // A frontend tool: the agent calls it, the page runs it and renders the call in the chat.
  useFrontendTool({
    name: "show_card",
    description: "Show a card with a title and an optional body in the user's page",
    parameters: cardArgs,
    handler: async ({ title }) => `card "${title}" shown`,
    render: ({ args, status }) => (
      <div className="card" data-testid="tool-card" data-status={status}>
        <strong>{args.title ?? "…"}</strong>
        {args.body ? <p>{args.body}</p> : null}
      </div>
    ),
  });

  // agui-serve asks for permission by calling this tool; the answer is {"optionId": ...}.
  useHumanInTheLoop({
    name: "agui_permission_request",
    description: "Ask the user to approve or deny an action the agent wants to take",
    parameters: permissionArgs,
    render: ApprovalCard,
  });
  return null;
}

function ApprovalCard({ args, status, respond, result }) {
  return (
    <div className="card approval" data-testid="approval" data-status={status}>
      <strong>{args.title ?? "Permission requested"}</strong>
      {args.toolCall ? <CallDetails call={args.toolCall} /> : null}
      {status === "complete" ? (
        <p className="muted">Answered: {answerName(args.options, result)}</p>
      ) : (
        <div className="buttons">
          {(args.options ?? []).map((option) => (
            <button
              key={option.optionId}
              type="button"
              disabled={!respond}
              data-kind={option.kind}
              onClick={() => respond?.({ optionId: option.optionId })}
            >
              {option.name}
            </button>
          ))}
        </div>
      )}
    </div>
  );
}

// What a person approves: the command, or the file and what it will hold, and each diff.
function CallDetails({ call }) {
  const input = call.input && typeof call.input === "object" ? call.input : {};
  const command = typeof input.command === "string" ? input.command : null;
  const file = typeof input.file_path === "string" ? input.file_path : null;
  return (
    <div className="call" data-testid="approval-call">
      <p className="muted">
        {call.name}
        {command ? ": " : null}
        {command ? <code>{command}</code> : null}
        {file ? ` ${file}` : null}
      </p>
      {(call.diff ?? []).map((diff, i) => (
        <pre key={i} data-testid="approval-diff">
          {(diff.oldText ?? "")
            .split("\n")
            .filter((l) => l)
            .map((l, j) => (
              <span key={`o${j}`} className="removed">{`- ${l}\n`}</span>
            ))}
          {diff.newText
            .split("\n")
            .filter((l) => l)
            .map((l, j) => (
              <span key={`n${j}`} className="added">{`+ ${l}\n`}</span>
            ))}
        </pre>
      ))}
      {!command && !(call.diff ?? []).length && Object.keys(input).length ? (
        <pre data-testid="approval-input">{JSON.stringify(input, null, 2).slice(0, 4096)}</pre>
      ) : null}
    </div>
  );
}

function answerName(options = [], result) {
  try {
    const { optionId } = typeof result === "string" ? JSON.parse(result) : result;
    return options.find((o) => o.optionId === optionId)?.name ?? optionId;
  } catch {
    return String(result);
  }
}
