#!/usr/bin/env bash
# The Debian package on this machine, as an operator meets it: builds it from BINARY (no
# second build), installs it with dpkg, checks what it made (user, token, directories,
# config, unit), starts the daemon as the unit would, streams a demo run through it,
# drives the stock CopilotKit page against it in headless Chromium, upgrades the package
# in place (the token, the data and the thread kept), removes it (data kept) and purges
# it (all gone). Needs root and dpkg. Without systemd as PID 1 the daemon runs as the
# unit's user with the unit's credentials, umask, open-file limit, no new privileges and
# an empty capability bounding set; under systemd, through systemctl.
# Usage: scripts/package.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$(realpath "${1:-$root/target/debug/agui-serve}")"
[ "$(id -u)" = 0 ] || { echo "package: needs root (dpkg -i, a system user)" >&2; exit 1; }
command -v dpkg-deb >/dev/null || { echo "package: needs dpkg" >&2; exit 1; }
if dpkg -s agui-serve >/dev/null 2>&1; then
  echo "package: agui-serve is installed on this machine already; not touching it" >&2
  exit 1
fi
source "$root/scripts/lib.sh"
purge() { dpkg -P agui-serve >/dev/null 2>&1 || true; userdel agui-serve 2>/dev/null || true; groupdel agui-serve 2>/dev/null || true; }
trap 'purge; cleanup' EXIT
fail() { echo "package: $*" >&2; exit 1; }
systemd=false
[ -d /run/systemd/system ] && systemd=true
if curl -sk -o /dev/null --max-time 2 https://127.0.0.1:8443/ || curl -s -o /dev/null --max-time 2 http://127.0.0.1:8443/; then
  fail "something already listens on 127.0.0.1:8443, the packaged configuration's port"
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
first="$(DEB_COMPRESSION=gzip "$root/scripts/deb.sh" "$bin" "$version")"
second="$(DEB_COMPRESSION=gzip "$root/scripts/deb.sh" "$bin" "$version+upgrade1")"

echo "-- dpkg -i $(basename "$first")"
dpkg -i "$first" >/dev/null
[ -x /usr/bin/agui-serve ] || fail "no /usr/bin/agui-serve"
getent passwd agui-serve | grep -q ':/usr/sbin/nologin$' || fail "no system user agui-serve"
[ "$(stat -c '%a %U:%G' /etc/agui-serve/token)" = "600 root:root" ] \
  || fail "token is $(stat -c '%a %U:%G' /etc/agui-serve/token)"
dpkg-deb -f "$first" Depends | grep -q 'libc6 (>= ' || fail "Depends names no libc6 version: $(dpkg-deb -f "$first" Depends)"
grep -Eq '^[0-9a-f]{64}$' /etc/agui-serve/token || fail "the token is not 32 random bytes in hex"
[ "$(stat -c '%a %U' /var/lib/agui-serve)" = "700 agui-serve" ] || fail "/var/lib/agui-serve is $(stat -c '%a %U' /var/lib/agui-serve)"
grep -qx /etc/agui-serve/config.toml /var/lib/dpkg/info/agui-serve.conffiles || fail "config.toml is no conffile"
[ -f /lib/systemd/system/agui-serve.service ] || fail "no unit"
checked="$(/usr/bin/agui-serve check-config --config /etc/agui-serve/config.toml 2>&1)" || fail "check-config: $checked"
grep -q '"warnings": \[\]' <<<"$checked" || fail "check-config warns: $checked"
token="$(cat /etc/agui-serve/token)"
echo "$token" >"$work/token"

# The unit's ExecStart, as its user (or the unit itself under systemd).
unit_pid=""
start_unit() {
  if $systemd; then
    systemctl restart agui-serve.service
  else
    local creds="$work/credentials"
    chmod 0711 "$work"
    install -d -m 0700 -o agui-serve "$creds"
    install -m 0400 -o agui-serve /etc/agui-serve/token "$creds/token"
    local exec
    exec="$(sed -n 's/^ExecStart=//p' /lib/systemd/system/agui-serve.service)"
    exec="${exec//\$\{CREDENTIALS_DIRECTORY\}/$creds}"
    : >"$work/unit.log"
    chown agui-serve "$work/unit.log"
    (
      cd /
      umask 0077
      ulimit -n 8192
      # shellcheck disable=SC2086
      exec env -i PATH=/usr/bin:/bin STATE_DIRECTORY=/var/lib/agui-serve CREDENTIALS_DIRECTORY="$creds" \
        setpriv --reuid agui-serve --regid agui-serve --init-groups --no-new-privs --bounding-set -all \
        $exec >>"$work/unit.log" 2>&1
    ) &
    unit_pid=$!
  fi
  for _ in $(seq 1 300); do
    curl -sk -o /dev/null https://127.0.0.1:8443/agui/healthz && return 0
    sleep 0.1
  done
  cat "$work/unit.log" >&2 2>/dev/null || journalctl -u agui-serve --no-pager -n 40 >&2 || true
  fail "the daemon did not answer on https://127.0.0.1:8443"
}
stop_unit() {
  if $systemd; then
    systemctl stop agui-serve.service 2>/dev/null || true
  elif [ -n "$unit_pid" ]; then
    pkill -TERM -u agui-serve -x agui-serve 2>/dev/null || true
    wait "$unit_pid" 2>/dev/null || true
    unit_pid=""
  fi
}
trap 'stop_unit; purge; cleanup' EXIT
# The text of an event stream's messages, its deltas joined.
said() {
  sed -n 's/^data: //p' | /usr/bin/python3 -c 'import json, sys
print("".join(e.get("delta", "") for e in map(json.loads, sys.stdin) if e["type"] == "TEXT_MESSAGE_CONTENT"))'
}
run() {
  curl -sk -N https://127.0.0.1:8443/agui/demo -H "Authorization: Bearer $token" \
    -H 'content-type: application/json' -H 'accept: text/event-stream' \
    -d "{\"threadId\":\"$1\",\"runId\":\"$2\",\"protocolVersion\":\"1.0\",\"messages\":[{\"id\":\"$2-m\",\"role\":\"user\",\"content\":\"$3\"}]}"
}

echo "-- the daemon as the unit starts it"
start_unit
$systemd || [ "$(ps -o user= -p "$(pgrep -u agui-serve -x agui-serve | head -n1)")" = agui-serve ] \
  || fail "the daemon does not run as agui-serve"
[ -f /var/lib/agui-serve/tls/cert.pem ] || fail "no generated certificate in /var/lib/agui-serve/tls"
out="$(run installed r1 "hello from the package")"
[ "$(said <<<"$out")" = "You said: hello from the package" ] || fail "the demo run: $out"
grep -q RUN_FINISHED <<<"$out" || fail "no RUN_FINISHED: $out"
nobody="$(curl -sk -o /dev/null -w '%{http_code}' https://127.0.0.1:8443/agui/info)"
[ "$nobody" = 401 ] || fail "without the token: $nobody"

echo "-- the stock CopilotKit page against the installed daemon"
app="$root/examples/copilotkit"
[ -f "$app/dist/index.html" ] || fail "examples/copilotkit is not built (scripts/browser-e2e.sh builds it)"
(cd "$app" && AGUI_URL="https://127.0.0.1:8443/agui/demo" AGUI_TOKEN_FILE=/etc/agui-serve/token \
  NODE_EXTRA_CA_CERTS=/var/lib/agui-serve/tls/cert.pem PORT=0 exec node server.mjs) >"$work/app" 2>"$work/app.err" &
pids+=($!)
page="$(wait_for_url "$work/app" "copilotkit example listening on" "${pids[-1]}")"
(cd "$app" && E2E_URL="$page" CHROMIUM="${CHROMIUM:-/usr/bin/chromium}" AGUI_BASE="https://127.0.0.1:8443/agui" \
  AGUI_TOKEN_FILE=/etc/agui-serve/token NODE_EXTRA_CA_CERTS=/var/lib/agui-serve/tls/cert.pem \
  node e2e/run.mjs) || fail "the CopilotKit page against the installed daemon"
kill -TERM "${pids[-1]}" 2>/dev/null || true

echo "-- upgrade in place to $version+upgrade1"
$systemd || stop_unit
dpkg -i "$second" >/dev/null
[ "$(dpkg-query -W -f '${Version}' agui-serve)" = "$version+upgrade1" ] || fail "not upgraded"
[ "$(cat /etc/agui-serve/token)" = "$token" ] || fail "the upgrade changed the token"
start_unit
threads="$(curl -sk https://127.0.0.1:8443/agui/threads -H "Authorization: Bearer $token")"
grep -q '"installed"' <<<"$threads" || fail "the thread did not survive the upgrade: $threads"
out="$(run installed r2 "after the upgrade")"
[ "$(said <<<"$out")" = "You said: after the upgrade" ] || fail "after the upgrade: $out"
stop_unit

echo "-- dpkg -r keeps the data, dpkg -P removes it (the user stays), installing again works"
dpkg -r agui-serve >/dev/null
[ ! -e /usr/bin/agui-serve ] || fail "the binary is still there"
[ -f /etc/agui-serve/config.toml ] && [ -f /etc/agui-serve/token ] || fail "removal took the configuration"
[ -n "$(ls /var/lib/agui-serve)" ] || fail "removal took the data"
dpkg -P agui-serve >/dev/null
[ ! -e /etc/agui-serve ] && [ ! -e /var/lib/agui-serve ] || fail "purge left files"
getent passwd agui-serve >/dev/null || fail "purge removed the system user (Debian keeps it)"
# Installed again over the kept user: no error.
dpkg -i "$first" >/dev/null
dpkg -P agui-serve >/dev/null
userdel agui-serve 2>/dev/null || true
groupdel agui-serve 2>/dev/null || true
echo "package: ok (installed, served, upgraded, removed, purged$($systemd && echo ', under systemd'))"
