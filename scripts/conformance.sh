#!/usr/bin/env bash
# Starts agui-serve (TLS, generated certificate, port 0) and drives it with the official
# AG-UI clients (@ag-ui/client 1.0.0 and 0.0.59). Usage: scripts/conformance.sh [BINARY]
# AGUI_DAEMON_ARGS: more daemon arguments, as shell words (e.g. "--port 9443 --store
# 'host=/run/postgresql dbname=agui'"); --port there replaces the free port. Not --data-dir
# or --token: the suite sets those.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || { echo "conformance: no binary at $bin (cargo build first)" >&2; exit 1; }

(cd "$root/conformance" && npm ci --no-audit --no-fund --loglevel=error)

# The ACP agents the suite fronts: the scripted one (official Rust SDK, built by
# `cargo test`) and one written with the official Python SDK, in a cached virtualenv.
scripted="$root/target/debug/examples/scripted_acp_agent"
[ -x "$scripted" ] || (cd "$root" && cargo build --example scripted_acp_agent)
venv="$root/conformance/.venv"
# The agents run confined: their interpreter must lie in the system's paths, not under
# the daemon's $HOME (a pyenv or user install there is refused, as it should be).
python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
if ! "$venv/bin/python" -c "import acp" 2>/dev/null \
  || [ "$(readlink -f "$venv/bin/python")" != "$(readlink -f "$python")" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "agent-client-protocol==0.12.1"
fi

source "$root/scripts/lib.sh"
token="conformance-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
cat >"$work/config.toml" <<'TOML'
[[agents]]
name = "demo"
kind = "demo"

[[agents]]
name = "demo-interrupt"
kind = "demo"
hitl = "interrupt"
description = "The demo agent, asking permission through AG-UI interrupts"
TOML
cat >>"$work/config.toml" <<TOML

[[agents]]
name = "scripted"
kind = "acp"
command = ["$scripted"]
permissions = "ask"

[[agents]]
name = "scripted-interrupt"
kind = "acp"
command = ["$scripted"]
permissions = "ask"
hitl = "interrupt"

[[agents]]
name = "python"
kind = "acp"
command = ["$venv/bin/python", "$root/tests/agents/python_acp_agent.py"]
permissions = "ask"
# Confined (the default): the virtualenv and the script are read, nothing else of the tree.
sandbox = { read = ["$venv", "$root/tests/agents"] }

[[agents]]
name = "python-interrupt"
kind = "acp"
command = ["$venv/bin/python", "$root/tests/agents/python_acp_agent.py"]
permissions = "ask"
# Confined (the default): the virtualenv and the script are read, nothing else of the tree.
sandbox = { read = ["$venv", "$root/tests/agents"] }
hitl = "interrupt"
TOML
extra=()
if [ -n "${AGUI_DAEMON_ARGS:-}" ]; then
  python3 -c 'import shlex, sys; sys.stdout.write("".join(a + "\0" for a in shlex.split(sys.argv[1])))' \
    "$AGUI_DAEMON_ARGS" >"$work/daemon-args"
  mapfile -d '' -t extra <"$work/daemon-args"
fi
start_daemon --config "$work/config.toml" --token "$token" --disconnect-grace 2s "${extra[@]}"
url="$daemon"

cd "$root/conformance"
ca="$work/data/tls/cert.pem"
AGUI_URL="$url" AGUI_TOKEN="$token" AGUI_LABEL="master token" NODE_EXTRA_CA_CERTS="$ca" node run.mjs

# The same scenarios over the protobuf encoding (Accept: application/vnd.ag-ui.event+proto).
AGUI_URL="$url" AGUI_TOKEN="$token" AGUI_LABEL="protobuf" AGUI_TRANSPORT=protobuf \
  NODE_EXTRA_CA_CERTS="$ca" node run.mjs

# The same scenarios as a principal: a scoped token minted by POST {path}/tokens.
scoped="$(curl -sS --fail-with-body --cacert "$ca" -H "Authorization: Bearer $token" \
  -H 'content-type: application/json' -d '{"sub":"conformance","ttlSeconds":3600}' \
  "$url/tokens" | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')"
AGUI_URL="$url" AGUI_TOKEN="$scoped" AGUI_LABEL="scoped token" NODE_EXTRA_CA_CERTS="$ca" node run.mjs

# The principal saw only its own threads; the operator reaches its namespace by name.
threads() { curl -sS --fail-with-body --cacert "$ca" -H "Authorization: Bearer $1" "$url/threads?limit=200${2:-}"; }
threads "$scoped" | python3 -c '
import json, sys
owners = {t.get("owner", "") for t in json.load(sys.stdin)["threads"]}
assert owners == {"conformance"}, f"the scoped token listed threads of {owners}"
print("ok   the scoped token lists only its own threads")'
threads "$token" "&owner=conformance" | python3 -c '
import json, sys
owners = [t.get("owner", "") for t in json.load(sys.stdin)["threads"]]
assert owners and set(owners) == {"conformance"}, f"the operator listed owners {set(owners)}"
print("ok   the operator lists that principal threads by name")'
