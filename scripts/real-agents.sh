#!/usr/bin/env bash
# The real Claude Code and Codex ACP adapters, at the versions tests/agents/real pins,
# driven through the daemon by scripted model APIs on loopback (tests/real_agents.rs).
# The adapters are installed once into target/tools/real-agents and kept there until the
# pinned versions change. `--install-only`: install, print the folder, run nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/target/tools/real-agents"
mkdir -p "$tools"
if ! cmp -s "$root/tests/agents/real/package-lock.json" "$tools/package-lock.json" \
  || [ ! -x "$tools/node_modules/.bin/claude-agent-acp" ]; then
  echo "installing the adapters into $tools" >&2
  cp "$root/tests/agents/real/package.json" "$root/tests/agents/real/package-lock.json" "$tools/"
  (cd "$tools" && npm ci --no-audit --no-fund --loglevel=error </dev/null) >&2
fi
if [ "${1:-}" = "--install-only" ]; then
  echo "$tools"
  exit 0
fi
cd "$root"
AGUI_REAL_AGENTS="$tools" cargo test --locked --test real_agents -- --ignored
