#!/usr/bin/env bash
# Puts real nginx (with the location block of deploy/nginx.conf), Caddy (deploy/Caddyfile)
# and the Go reverse proxy of examples/reverse-proxy in front of agui-serve and shows, by
# arrival times, that /slow chunks arrive one by one through each, uncompressed, not in a
# batch at the end. Needs nginx, caddy, go and python3. Usage: scripts/proxy-streaming.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || (cd "$root" && cargo build --bin agui-serve)
source "$root/scripts/lib.sh"

token="proxy-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
start_daemon --no-tls --token "$token"
daemon_port="$(echo "$daemon" | sed -E 's#http://127.0.0.1:([0-9]+)/agui#\1#')"

# nginx with the location block from deploy/nginx.conf.
nginx_port="$(free_port)"
mkdir -p "$work/nginx/logs"
location="$(awk '/^    location \/agui \{/{p=1} p{print} p&&/^    \}/{exit}' "$root/deploy/nginx.conf")"
[ -n "$location" ] || { echo "no location block in deploy/nginx.conf" >&2; exit 1; }
cat >"$work/nginx/nginx.conf" <<NGINX
worker_processes 1;
error_log $work/nginx/logs/error.log warn;
pid $work/nginx/nginx.pid;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    upstream agui_serve { server 127.0.0.1:$daemon_port; keepalive 16; }
    server {
        listen 127.0.0.1:$nginx_port;
        client_max_body_size 8m;
$location
    }
}
NGINX
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)

# Caddy with deploy/Caddyfile, its site address and upstream pointed at this test's ports.
caddy_port="$(free_port)"
mkdir -p "$work/caddy"
{
  printf '{\n\tadmin off\n}\n'
  sed -e "s#^agents.example.com {#http://127.0.0.1:$caddy_port {#" \
    -e "s#reverse_proxy 127.0.0.1:8443#reverse_proxy 127.0.0.1:$daemon_port#" "$root/deploy/Caddyfile"
} >"$work/caddy/Caddyfile"
grep -q "127.0.0.1:$caddy_port {" "$work/caddy/Caddyfile" && grep -q "reverse_proxy 127.0.0.1:$daemon_port" "$work/caddy/Caddyfile" \
  || { echo "deploy/Caddyfile no longer has the site and upstream this test rewrites" >&2; exit 1; }
XDG_DATA_HOME="$work/caddy" XDG_CONFIG_HOME="$work/caddy" \
  caddy run --adapter caddyfile --config "$work/caddy/Caddyfile" 2>"$work/caddy.err" &
pids+=($!)

# The Go reverse proxy.
go_port="$(free_port)"
(cd "$root/examples/reverse-proxy" && GOFLAGS=-mod=mod go build -o "$work/reverse-proxy" .)
AGUI_TOKEN="$token" "$work/reverse-proxy" -listen "127.0.0.1:$go_port" -upstream "http://127.0.0.1:$daemon_port" \
  2>"$work/go.err" &
pids+=($!)
for port in "$nginx_port" "$caddy_port" "$go_port"; do
  for _ in $(seq 1 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
    sleep 0.05
  done
done

check() {
  local name="$1" result="$2"
  echo "$name: $result"
  python3 - "$name" "$result" <<'PY'
import json, sys
name, result = sys.argv[1], json.loads(sys.argv[2])
assert result["status"] == 200, f"{name}: HTTP {result['status']}: {result.get('body')}"
assert result["encoding"] is None, f"{name}: the stream was compressed ({result['encoding']})"
arrivals = result["arrivals"]
assert len(arrivals) == 6, f"{name}: {len(arrivals)} chunks"
assert result["terminal"] == "RUN_FINISHED", f"{name}: terminal {result['terminal']}"
# Produced 300 ms apart: buffered delivery would bunch them at the end.
spread = arrivals[-1] - arrivals[0]
gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
assert spread >= 1.0, f"{name}: chunks arrived together (spread {spread:.3f}s)"
assert sum(1 for g in gaps if g >= 0.15) >= 4, f"{name}: gaps {gaps}"
PY
}
check "direct" "$(python3 "$root/scripts/stream_timing.py" "$daemon/demo" "$token")"
check "nginx" "$(python3 "$root/scripts/stream_timing.py" "http://127.0.0.1:$nginx_port/agui/demo" "$token")"
check "caddy" "$(python3 "$root/scripts/stream_timing.py" "http://127.0.0.1:$caddy_port/agui/demo" "$token")"
# Through the Go proxy the browser holds no token, sends ?token= junk and an Origin the
# daemon would refuse: the proxy strips both and sets the daemon's token itself.
check "go-proxy" "$(python3 "$root/scripts/stream_timing.py" "http://127.0.0.1:$go_port/agui/demo?token=leaked" "" "https://evil.example")"
# CopilotKit's single-endpoint transport posts to the route namespace itself ({path}, no
# trailing slash): each proxy must pass it through.
envelope() { # NAME URL [TOKEN]
  local auth=()
  [ -n "${3:-}" ] && auth=(-H "Authorization: Bearer $3")
  local body
  body="$(curl -sS -X POST "$2" "${auth[@]}" -H 'content-type: application/json' \
    --data '{"method":"info"}')"
  echo "$body" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["mode"]=="sse" and "demo" in d["agents"], d' \
    || { echo "$1: the envelope did not reach the daemon: $body" >&2; exit 1; }
}
envelope "nginx" "http://127.0.0.1:$nginx_port/agui" "$token"
envelope "caddy" "http://127.0.0.1:$caddy_port/agui" "$token"
envelope "go-proxy" "http://127.0.0.1:$go_port/agui"
echo "ok: chunks stream one by one through nginx, Caddy and the Go proxy; the envelope passes"
