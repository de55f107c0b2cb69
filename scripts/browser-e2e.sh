#!/usr/bin/env bash
# The CopilotKit example and the daemon's operator console in a real browser: starts agui-serve (demo agent, TLS with its
# generated certificate, token from a file), builds and starts examples/copilotkit (the
# CopilotKit v2 runtime holding the token server-side), and drives the page with Debian's
# Chromium through playwright-core. Needs node, npm and /usr/bin/chromium (or CHROMIUM).
# Usage: scripts/browser-e2e.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || (cd "$root" && cargo build --locked --bin agui-serve)
bin="$(realpath "$bin")"
chromium="${CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] || { echo "browser-e2e: no Chromium at $chromium (apt-get install chromium)" >&2; exit 1; }
app="$root/examples/copilotkit"
# E2E_SCREENSHOTS=DIR (e.g. examples/copilotkit/screenshots): the runtime-mode pass also
# writes its screenshots of the page (those examples/copilotkit/README.md shows) there.
screenshots=""
if [ -n "${E2E_SCREENSHOTS:-}" ]; then
  mkdir -p "$E2E_SCREENSHOTS"
  screenshots="$(realpath "$E2E_SCREENSHOTS")"
fi

# npm ci wipes node_modules; skip it when the installed tree came from this very lockfile.
stamp="$app/node_modules/.installed-from-lockfile"
lock_sum="$(sha256sum "$app/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
  (cd "$app" && SCARF_ANALYTICS=false npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >"$stamp"
fi
(cd "$app" && npx vite build --logLevel warn)
[ -f "$app/dist/index.html" ] || { echo "browser-e2e: the page did not build" >&2; exit 1; }

source "$root/scripts/lib.sh"
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$work/token"
start_daemon --token-file "$work/token"

(cd "$app" && AGUI_URL="$daemon/demo" AGUI_TOKEN_FILE="$work/token" \
  NODE_EXTRA_CA_CERTS="$work/data/tls/cert.pem" PORT=0 exec node server.mjs) >"$work/app" 2>"$work/app.err" &
pids+=($!)
page="$(wait_for_url "$work/app" "copilotkit example listening on" "${pids[-1]}")"

status=0
(cd "$app" && E2E_URL="$page" CHROMIUM="$chromium" AGUI_BASE="$daemon" AGUI_TOKEN_FILE="$work/token" \
  E2E_SCREENSHOTS="$screenshots" NODE_EXTRA_CA_CERTS="$work/data/tls/cert.pem" node e2e/run.mjs) || status=$?
# The demo agent and the scripted ACP agent, as configuration (the daemons below serve
# both).
(cd "$root" && cargo build --quiet --example scripted_acp_agent)
two_agents() {
  cat <<TOML
[[agents]]
name = "demo"
kind = "demo"

[[agents]]
name = "scripted"
kind = "acp"
command = ["$root/target/debug/examples/scripted_acp_agent"]
TOML
}
# The daemon's own operator console, in the same browser, on a daemon of its own serving
# the demo agent, the scripted ACP agent (tool calls with diffs and terminal output,
# approvals, forms), a demo agent with a token budget and one that asks by interrupt. Its
# screenshots at desktop and phone widths are kept in target/console-screenshots
# (CONSOLE_SCREENSHOTS elsewhere).
echo "== the built-in operator console"
{ two_agents; cat <<TOML

[[agents]]
name = "metered"
kind = "demo"
budget = { tokens = 12 }

[[agents]]
name = "asking"
kind = "demo"
hitl = "interrupt"
TOML
} >"$work/console.toml"
"$bin" --config "$work/console.toml" --port 0 --data-dir "$work/console-data" --token-file "$work/token" \
  >"$work/console" 2>"$work/console.err" &
pids+=($!)
console_daemon="$(wait_for_url "$work/console" "agui-serve listening on" "${pids[-1]}")"
console_shots="${CONSOLE_SCREENSHOTS:-$root/target/console-screenshots}"
(cd "$app" && CHROMIUM="$chromium" AGUI_BASE="$console_daemon" AGUI_TOKEN_FILE="$work/token" \
  CONSOLE_SCREENSHOTS="$console_shots" NODE_EXTRA_CA_CERTS="$work/console-data/tls/cert.pem" \
  node e2e/console.mjs) || { status=$?; tail -n 40 "$work/console.err" >&2; }
# What a browser developer is told: a refused origin, an untrusted certificate.
echo "== diagnostics in the browser and the log"
(cd "$app" && E2E_URL="$page" CHROMIUM="$chromium" AGUI_BASE="$daemon" AGUI_TOKEN_FILE="$work/token" \
  DAEMON_LOG="$work/daemon.err" node e2e/diagnostics.mjs) || status=$?
# Direct mode: the same page built for the daemon's own CopilotKit routes, served as static
# files by the Go reverse proxy of examples/reverse-proxy, which forwards {path} to the
# daemon with the token: no Node process at run time, and the browser holds no token.
(cd "$app" && VITE_RUNTIME_URL=/agui VITE_AGENT_ID=demo \
  npx vite build --logLevel warn --outDir dist-direct --emptyOutDir)
[ -f "$app/dist-direct/index.html" ] || { echo "browser-e2e: the direct page did not build" >&2; exit 1; }
(cd "$root/examples/reverse-proxy" && GOFLAGS=-mod=mod go build -o "$work/reverse-proxy" .)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Its own daemon on a fixed port and data directory, so the test can restart it; besides
# the demo agent it serves the scripted ACP agent, taking images, for the upload case.
direct_port="$(free_port)"
{ two_agents; cat <<TOML
env = { SCRIPTED_AGENT_IMAGES = "1" }
TOML
} >"$work/direct.toml"
cat >"$work/direct-daemon.sh" <<SH
#!/usr/bin/env bash
# (Re)starts the direct-mode daemon and waits until it listens.
set -euo pipefail
if [ -f "$work/direct.pid" ]; then
  pid="\$(cat "$work/direct.pid")"
  kill -TERM "\$pid" 2>/dev/null || true
  while kill -0 "\$pid" 2>/dev/null; do sleep 0.1; done
fi
: >"$work/direct.out"
"$bin" --config "$work/direct.toml" --port "$direct_port" --data-dir "$work/direct-data" --token-file "$work/token" \
  >"$work/direct.out" 2>>"$work/direct.err" &
echo \$! >"$work/direct.pid"
for _ in \$(seq 1 600); do
  grep -q "agui-serve listening on" "$work/direct.out" 2>/dev/null && exit 0
  sleep 0.05
done
echo "the direct-mode daemon did not start:" >&2
cat "$work/direct.out" >&2
tail -n 5 "$work/direct.err" >&2
exit 1
SH
chmod +x "$work/direct-daemon.sh"
"$work/direct-daemon.sh"
direct="https://127.0.0.1:$direct_port/agui"
proxy_port="$(free_port)"
AGUI_TOKEN="$(cat "$work/token")" "$work/reverse-proxy" -listen "127.0.0.1:$proxy_port" \
  -upstream "https://127.0.0.1:$direct_port" -upstream-ca "$work/direct-data/tls/cert.pem" \
  -static "$app/dist-direct" >"$work/proxy" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$proxy_port/" >/dev/null && break
  sleep 0.1
done
echo "== direct mode: the page on agui-serve's CopilotKit routes through the Go proxy"
(cd "$app" && E2E_URL="http://127.0.0.1:$proxy_port" E2E_RESTART="$work/direct-daemon.sh" E2E_THREADS=1 E2E_UPLOAD_AGENT=scripted E2E_V1=1 E2E_SCREENSHOTS= \
  CHROMIUM="$chromium" AGUI_BASE="$direct" AGUI_TOKEN_FILE="$work/token" \
  NODE_EXTRA_CA_CERTS="$work/direct-data/tls/cert.pem" node e2e/run.mjs) || status=$?
kill -TERM "$(cat "$work/direct.pid")" 2>/dev/null || true
# CopilotKit's own client classes against the daemon directly (its runtime protocol, no
# Node runtime in between): REST routes and the single-endpoint envelope.
(cd "$app" && AGUI_BASE="$daemon" AGUI_TOKEN_FILE="$work/token" \
  NODE_EXTRA_CA_CERTS="$work/data/tls/cert.pem" node e2e/direct.mjs) || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- example server log" >&2; cat "$work/app" "$work/app.err" >&2
  echo "--- proxy log" >&2; cat "$work/proxy" >&2 2>/dev/null || true
  echo "--- direct-mode daemon log (tail)" >&2; tail -n 40 "$work/direct.err" >&2 2>/dev/null || true
  echo "--- daemon log (tail)" >&2; tail -n 40 "$work/daemon.err" >&2
fi
exit "$status"
