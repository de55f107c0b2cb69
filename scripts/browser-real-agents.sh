#!/usr/bin/env bash
# The CopilotKit example in headless Chromium with the real Claude Code and Codex adapters
# behind agui-serve, on the scripted model API (examples/scripted_model.rs): the approval
# card shows what a Claude Write writes and its diff, and a Codex command's output streams
# into the page while it runs. The adapters come from scripts/real-agents.sh; the page is
# the one scripts/browser-e2e.sh builds (built here if missing).
# Usage: scripts/browser-real-agents.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || (cd "$root" && cargo build --locked --bin agui-serve)
bin="$(realpath "$bin")"
chromium="${CHROMIUM:-/usr/bin/chromium}"
app="$root/examples/copilotkit"
tools="$("$root/scripts/real-agents.sh" --install-only)"
[ -d "$app/node_modules" ] || (cd "$app" && SCARF_ANALYTICS=false npm ci --no-audit --no-fund --loglevel=error)
[ -f "$app/dist/index.html" ] || (cd "$app" && npx vite build --logLevel warn)
(cd "$root" && cargo build --locked --quiet --example scripted_model)

source "$root/scripts/lib.sh"
cat >"$work/scripts.json" <<'JSON'
{
  "task-write": [
    {"tool": "Write", "input": {"file_path": "{cwd}/notes.txt", "content": "hello from claude\n"}},
    {"say": "All done."}
  ],
  "task-shell": [
    {"tool": "exec_command", "input": {"cmd": "echo one; sleep 1; echo two; sleep 1; echo three",
      "yield_time_ms": 10000, "sandbox_permissions": "require_escalated",
      "justification": "to print three lines"}},
    {"say": "The command printed three lines."}
  ]
}
JSON
"$root/target/debug/examples/scripted_model" "$work/scripts.json" >"$work/model" 2>"$work/model.err" &
pids+=($!)
model="$(wait_for_url "$work/model" "scripted model listening on" "$!")"
model_port="${model##*:}"

# Codex reads its provider from CODEX_HOME, outside the daemon's data directory (which a
# confined agent cannot reach).
mkdir -p "$work/codex-home"
cat >"$work/codex-home/config.toml" <<TOML
model = "gpt-5.5"
model_provider = "scripted"
check_for_update_on_startup = false
[model_providers.scripted]
name = "Scripted"
base_url = "$model/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"
request_max_retries = 0
stream_max_retries = 0
[analytics]
enabled = false
TOML
cat >"$work/agui.toml" <<TOML
[[agents]]
name = "claude"
kind = "acp"
command = ["$tools/node_modules/.bin/claude-agent-acp"]
env = { ANTHROPIC_BASE_URL = "$model", ANTHROPIC_API_KEY = "sk-ant-scripted", IS_SANDBOX = "1", DISABLE_AUTOUPDATER = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }
permissions = "ask"
mode = "default"
workspace = { source = "empty" }
sandbox = { read = ["$tools"], connect = [$model_port] }

[[agents]]
name = "codex"
kind = "acp"
command = ["$tools/node_modules/.bin/codex-acp"]
env = { CODEX_HOME = "$work/codex-home", SCRIPTED_API_KEY = "scripted", INITIAL_AGENT_MODE = "workspace-write", NO_BROWSER = "1" }
permissions = "ask"
workspace = { source = "empty" }
sandbox = { read = ["$tools"], write = ["$work/codex-home"], connect = [$model_port] }
TOML
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$work/token"
start_daemon --token-file "$work/token" --config "$work/agui.toml"

# One example server per agent (the runtime's agent is one URL).
for agent in claude codex; do
  (cd "$app" && AGUI_URL="$daemon/$agent" AGUI_TOKEN_FILE="$work/token" \
    NODE_EXTRA_CA_CERTS="$work/data/tls/cert.pem" PORT=0 exec node server.mjs) \
    >"$work/app-$agent" 2>"$work/app-$agent.err" &
  pids+=($!)
  declare "page_$agent=$(wait_for_url "$work/app-$agent" "copilotkit example listening on" "$!")"
done

status=0
(cd "$app" && E2E_CLAUDE="$page_claude" E2E_CODEX="$page_codex" CHROMIUM="$chromium" \
  node e2e/agents.mjs) || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- daemon log (tail)" >&2; tail -n 60 "$work/daemon.err" >&2
  echo "--- model log" >&2; tail -n 20 "$work/model.err" >&2
  for agent in claude codex; do
    echo "--- example server ($agent)" >&2; tail -n 20 "$work/app-$agent.err" >&2
  done
fi
exit "$status"
