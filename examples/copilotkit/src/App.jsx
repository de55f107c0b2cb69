import { useMemo, useState } from "react";
import {
  CopilotChat,
  CopilotKitProvider,
  useAgent,
  useFrontendTool,
  useHumanInTheLoop,
  useThreads,
} from "@copilotkit/react-core/v2";
import { z } from "zod";

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
const AGENT_ID = import.meta.env.VITE_AGENT_ID ?? "default";
// In direct mode the daemon serves CopilotKit's thread list (`{path}/threads`).
const DIRECT = import.meta.env.VITE_RUNTIME_URL !== undefined;

export function App() {
  const threadId = useMemo(threadFromUrl, []);
  // A run that ends in RUN_ERROR (the agent failed, the daemon is unreachable, the run was
  // refused) is shown to the person, not only logged.
  const [error, setError] = useState(null);
  return (
    <CopilotKitProvider runtimeUrl={RUNTIME_URL} showDevConsole={false}>
      <Tools />
      <div className="layout">
        <section className="chat" aria-label="Chat">
          {error ? (
            <div className="error" role="alert" data-testid="run-error">
              <span>{error}</span>
              <button type="button" onClick={() => setError(null)}>
                Dismiss
              </button>
            </div>
          ) : null}
          <CopilotChat
            agentId={AGENT_ID}
            threadId={threadId}
            labels={{ chatInputPlaceholder: "Message the agent…" }}
            onError={({ error }) => setError(error.message)}
          />
        </section>
        <aside className="side">
          <TodoPanel />
          {DIRECT ? <ThreadList current={threadId} /> : null}
        </aside>
      </div>
    </CopilotKitProvider>
  );
}

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
function ThreadList({ current }) {
  const { threads } = useThreads({ agentId: AGENT_ID, limit: 20 });
  return (
    <nav className="threads" aria-label="Threads" data-testid="threads">
      <h2>Threads</h2>
      <ul>
        {threads.map((thread) => (
          <li key={thread.id} data-current={thread.id === current ? "true" : undefined}>
            <a href={`?thread=${encodeURIComponent(thread.id)}`} data-thread={thread.id}>
              {thread.name ?? `${thread.id.slice(0, 8)}…`}
            </a>
          </li>
        ))}
      </ul>
      <a href="?" data-testid="new-thread">New thread</a>
    </nav>
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

function answerName(options = [], result) {
  try {
    const { optionId } = typeof result === "string" ? JSON.parse(result) : result;
    return options.find((o) => o.optionId === optionId)?.name ?? optionId;
  } catch {
    return String(result);
  }
}
