#!/usr/bin/env bash
# End-to-end check of the frontend-tools MCP bridge with an independent ACP agent:
# `elizacp --deterministic acp` (crates.io `elizacp`) calls MCP tools on the servers it is
# given in session/new when asked "Use tool <server>::<tool> with <json>".
#
# Usage: scripts/elizacp-mcp.sh [BINARY]   (installs elizacp under .tools/ when missing;
# that compile takes a couple of minutes; the test command runs this script)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || (cd "$root" && cargo build --bin agui-serve)
eliza="$(command -v elizacp || true)"
if [ -z "$eliza" ]; then
  eliza="$root/.tools/bin/elizacp"
  # A debug build: half the compile time of a release one, and fast enough for one prompt.
  [ -x "$eliza" ] || cargo install --locked --debug --root "$root/.tools" elizacp@12.0.0
fi

source "$root/scripts/lib.sh"
token="eliza-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
# elizacp takes HTTP MCP servers without advertising mcpCapabilities.http: force it.
cat >"$work/config.toml" <<TOML
[[agents]]
name = "eliza"
kind = "acp"
command = ["$eliza", "--deterministic", "acp"]
mcp_frontend_tools = "always"
TOML
start_daemon --config "$work/config.toml" --no-tls --token "$token"
url="$daemon"

post() {
  curl -sS -N "$url/eliza" -H "authorization: Bearer $token" -H 'content-type: application/json' -d "$1"
}
tools='[{"name":"chart","description":"draws a chart","parameters":{"type":"object","properties":{"kind":{"type":"string"}}}}]'
ask='Use tool frontend::chart with {"kind": "bar"}'
first="$(post "{\"threadId\":\"eliza\",\"runId\":\"r1\",\"protocolVersion\":\"1.0\",\"tools\":$tools,\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":$(printf '%s' "$ask" | python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))')}]}")"
echo "$first" | grep '^data:' | cut -c1-200
call="$(echo "$first" | sed -n 's/^data: //p' | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    if e["type"] == "TOOL_CALL_START" and e["toolCallName"] == "chart":
        print(e["toolCallId"]); break')"
[ -n "$call" ] || { echo "FAIL: elizacp did not call the frontend tool" >&2; exit 1; }
second="$(post "{\"threadId\":\"eliza\",\"runId\":\"r2\",\"protocolVersion\":\"1.0\",\"tools\":$tools,\"messages\":[{\"id\":\"u1\",\"role\":\"user\",\"content\":$(printf '%s' "$ask" | python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))')},{\"id\":\"a1\",\"role\":\"assistant\",\"toolCalls\":[{\"id\":\"$call\",\"type\":\"function\",\"function\":{\"name\":\"chart\",\"arguments\":\"{}\"}}]},{\"id\":\"t1\",\"role\":\"tool\",\"toolCallId\":\"$call\",\"content\":\"a bar chart was drawn\"}]}")"
echo "$second" | grep '^data:' | cut -c1-200
echo "$second" | grep -q '"RUN_FINISHED"' || { echo "FAIL: the resumed run did not finish" >&2; exit 1; }
echo "$second" | grep -q 'a bar chart was drawn' || { echo "FAIL: the tool result did not reach elizacp" >&2; exit 1; }
echo "ok: elizacp called the frontend tool over MCP and got the browser's result"
