#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests, the conformance suite with the
# official AG-UI clients, frontend tools over MCP with elizacp, streaming through nginx,
# Caddy and the Go reverse proxy, and the CopilotKit example in headless Chromium. Installs
# what it needs from the registries (npm packages, a Python virtualenv, elizacp); needs
# cargo, node, python3, nginx, caddy, go and chromium (.ci/run installs the system packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --locked --no-fail-fast
echo "== conformance (official AG-UI clients)"
# `cargo test` has built the binary (the integration tests run it); build only if missing.
[ -x "$root/target/debug/agui-serve" ] || cargo build --locked --bin agui-serve
scripts/conformance.sh "$root/target/debug/agui-serve"
echo "== frontend tools over MCP with an independent ACP agent (elizacp)"
scripts/elizacp-mcp.sh "$root/target/debug/agui-serve"
echo "== streaming through nginx, Caddy and the Go reverse proxy"
scripts/proxy-streaming.sh "$root/target/debug/agui-serve"
echo "== the CopilotKit example in headless Chromium"
scripts/browser-e2e.sh "$root/target/debug/agui-serve"
