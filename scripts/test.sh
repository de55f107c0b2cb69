#!/usr/bin/env bash
# Every test: formatting, lints, dependency policy (cargo deny), unit and integration tests,
# the conformance suite with the official AG-UI clients, the resumable client package
# (clients/resume) through a proxy that cuts streams, frontend tools over MCP with
# elizacp, streaming through nginx, Caddy and the Go reverse proxy, a cluster of three nodes
# on a throwaway PostgreSQL, the real Claude Code and Codex adapters against scripted model
# APIs, and the CopilotKit example in headless Chromium (with the demo agent and with the
# real adapters), and the Debian package installed, served, upgraded and removed on this
# machine (as root). Installs what it needs from the registries (cargo-deny, npm packages, a
# Python virtualenv, elizacp);
# needs cargo, node, python3, curl, nginx, caddy, go, chromium, systemd-analyze, promtool,
# bwrap and PostgreSQL's server binaries: run as root on Debian it installs the missing
# ones itself, elsewhere it names them before it starts. `cargo test` alone needs only
# cargo; the tests that need promtool, systemd-analyze or bwrap run in their own phase here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# On a Debian machine, as root (CI, a fresh machine), the system packages the phases need
# are installed first when missing; elsewhere the check below names what to install.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  packages=()
  command -v node >/dev/null 2>&1 || packages+=(nodejs npm)
  command -v python3 >/dev/null 2>&1 || packages+=(python3)
  /usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || packages+=(python3-venv)
  command -v curl >/dev/null 2>&1 || packages+=(curl)
  command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
  command -v nginx >/dev/null 2>&1 || packages+=(nginx)
  command -v caddy >/dev/null 2>&1 || packages+=(caddy)
  command -v go >/dev/null 2>&1 || packages+=(golang-go)
  command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
  command -v bwrap >/dev/null 2>&1 || packages+=(bubblewrap)
  [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || packages+=(chromium)
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || packages+=(postgresql)
  if [ ${#packages[@]} -gt 0 ]; then
    echo "== installing ${packages[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" </dev/null
  fi
fi

# Every tool a later phase needs, checked before the first long one. Each entry:
# "COMMAND|Debian package|what needs it".
missing=()
for need in \
  "cargo|rustup (https://rustup.rs)|the build and cargo test" \
  "node|nodejs|the conformance suite and the CopilotKit example" \
  "npm|npm|the conformance suite and the CopilotKit example" \
  "python3|python3 python3-venv|the conformance suite's Python agent and the proxy test" \
  "curl|curl|the elizacp MCP test" \
  "nginx|nginx|streaming through nginx" \
  "caddy|caddy|streaming through Caddy" \
  "go|golang-go|streaming through the Go reverse proxy" \
  "systemd-analyze|systemd|tests/deploy.rs (the systemd unit verifies)" \
  "dpkg-deb|dpkg|the Debian package (scripts/package.sh)" \
  "setpriv|util-linux|the Debian package's daemon started as its unit would" \
  "promtool|prometheus|tests/metrics.rs (promtool check metrics)" \
  "bwrap|bubblewrap|tests/confine.rs (agents confined in bwrap)"; do
  IFS='|' read -r cmd package why <<<"$need"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd (Debian: $package) for $why")
done
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
  || missing+=("python3's venv module (Debian: python3-venv) for the conformance suite's Python agent")
chromium="${CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] || missing+=("chromium at $chromium (Debian: chromium; or set CHROMIUM) for the browser test")
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
  || missing+=("PostgreSQL's server at /usr/lib/postgresql/*/bin (Debian: postgresql) for the cluster test")
if [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/test.sh: missing tools; install them first:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo deny (bans, licenses, sources)"
# Advisories need a network database and are left out.
# Installed once per machine into cargo's own bin folder (a debug build: it checks the same
# and compiles in a fraction of the time); kept there for every later run.
command -v cargo-deny >/dev/null 2>&1 \
  || cargo install --locked --debug cargo-deny@0.20.2 </dev/null
cargo deny check --hide-inclusion-graph bans licenses sources
echo "== cargo test"
# Needs only cargo: the tests that need an outside tool are ignored there and run next.
cargo test --locked --no-fail-fast
echo "== tests that need outside tools (promtool, systemd-analyze, bwrap)"
# Each fails, not skips, when its tool is missing.
cargo test --locked --no-fail-fast --test metrics --test deploy --test confine --test egress -- --ignored
echo "== the real Claude Code and Codex adapters against scripted models"
scripts/real-agents.sh
echo "== conformance (official AG-UI clients)"
# `cargo test` has built the binary (the integration tests run it); build only if missing.
[ -x "$root/target/debug/agui-serve" ] || cargo build --locked --bin agui-serve
scripts/conformance.sh "$root/target/debug/agui-serve"
echo "== the resumable client through a proxy that cuts streams (both official clients)"
scripts/resume.sh "$root/target/debug/agui-serve"
echo "== frontend tools over MCP with an independent ACP agent (elizacp)"
scripts/elizacp-mcp.sh "$root/target/debug/agui-serve"
echo "== streaming through nginx, Caddy and the Go reverse proxy"
scripts/proxy-streaming.sh "$root/target/debug/agui-serve"
echo "== a cluster of three nodes on PostgreSQL"
scripts/cluster.sh "$root/target/debug/agui-serve"
echo "== the CopilotKit example in headless Chromium"
scripts/browser-e2e.sh "$root/target/debug/agui-serve"
echo "== the Debian package: built, installed, served (the CopilotKit page too), upgraded, removed"
scripts/package.sh "$root/target/debug/agui-serve"
echo "== the CopilotKit example with the real Claude Code and Codex adapters"
scripts/browser-real-agents.sh "$root/target/debug/agui-serve"
