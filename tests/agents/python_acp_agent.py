"""An ACP agent written with the official Python SDK (`pip install agent-client-protocol`),
driven by agui-serve's conformance suite: an independent ACP implementation.

Prompts: `permission` asks for permission before a tool call and reports the choice;
`usage` answers with the turn's token counts (20 in, 10 out, 30 in all); `elicit` asks
for a form (a required `name`) and reports the answer (`Python got: <name>`, `Python:
declined`, `Python: cancelled`); anything else streams `Python says: <text>` in chunks.
"""

import asyncio
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
)
from acp.schema import (
    AgentCapabilities,
    ElicitationFormSessionMode,
    ElicitationSchema,
    ElicitationStringPropertySchema,
    PermissionOption,
    ToolCallUpdate,
    Usage,
)


class PythonAgent(Agent):
    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"py-{uuid.uuid4()}")

    async def prompt(self, session_id: str, prompt: list, **kwargs: Any) -> PromptResponse:
        text = " ".join(getattr(block, "text", "") for block in prompt).strip()
        if text.endswith("usage"):
            await self._conn.session_update(session_id, update_agent_message_text("Python counted."))
            usage = Usage(total_tokens=30, input_tokens=20, output_tokens=10)
            return PromptResponse(stop_reason="end_turn", usage=usage)
        if text.endswith("elicit"):
            form = ElicitationSchema(
                properties={"name": ElicitationStringPropertySchema(type="string", title="Name")},
                required=["name"],
            )
            response = await self._conn.create_elicitation(
                message="Your name?",
                mode=ElicitationFormSessionMode(session_id=session_id, requested_schema=form),
            )
            if response.action == "accept":
                reply = f"Python got: {(response.content or {}).get('name')}"
            else:
                reply = "Python: declined" if response.action == "decline" else "Python: cancelled"
            await self._conn.session_update(session_id, update_agent_message_text(reply))
            return PromptResponse(stop_reason="end_turn")
        if text.endswith("permission"):
            call = f"py-call-{uuid.uuid4()}"
            await self._conn.session_update(
                session_id, start_tool_call(call, "Write notes.txt", kind="edit", raw_input={"path": "notes.txt"})
            )
            response = await self._conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id=call, title="Write notes.txt"),
                options=[
                    PermissionOption(option_id="py-allow", name="Allow", kind="allow_once"),
                    PermissionOption(option_id="py-reject", name="Reject", kind="reject_once"),
                ],
            )
            outcome = response.outcome
            chosen = getattr(outcome, "option_id", None) if outcome.outcome == "selected" else None
            verdict = "allowed" if chosen == "py-allow" else "rejected"
            await self._conn.session_update(
                session_id,
                update_tool_call(
                    call,
                    status="completed" if verdict == "allowed" else "failed",
                    content=[tool_content(text_block(verdict))],
                ),
            )
            await self._conn.session_update(session_id, update_agent_message_text(f"Python: {verdict}"))
            return PromptResponse(stop_reason="end_turn")
        for piece in ["Python ", "says: ", text]:
            await self._conn.session_update(session_id, update_agent_message_text(piece))
            await asyncio.sleep(0.01)
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(PythonAgent()))
