// The same chat under CopilotKit's v1 provider (`<CopilotKit runtimeUrl>` from
// @copilotkit/react-core), to show that apps still on the v1 API reach agui-serve too.
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { CopilotKit } from "@copilotkit/react-core";
import { CopilotChat } from "@copilotkit/react-core/v2";
import "@copilotkit/react-core/v2/styles.css";
import "./app.css";

const RUNTIME_URL = import.meta.env.VITE_RUNTIME_URL ?? "/api/copilotkit";
const AGENT_ID = import.meta.env.VITE_AGENT_ID ?? "default";

createRoot(document.getElementById("root")).render(
  <StrictMode>
    <CopilotKit runtimeUrl={RUNTIME_URL} agent={AGENT_ID} showDevConsole={false}>
      <section className="chat v1" aria-label="Chat">
        <CopilotChat agentId={AGENT_ID} labels={{ chatInputPlaceholder: "Message the agent…" }} />
      </section>
    </CopilotKit>
  </StrictMode>,
);
