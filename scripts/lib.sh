# shellcheck shell=bash
# Sourced by the test scripts. Sets `work` (a scratch directory) and `pids` (background
# processes); both are cleaned up on exit, as is a PostgreSQL started by pg_start. Needs
# `bin` (the agui-serve binary) for start_daemon.
work="$(mktemp -d)"
pids=()
pg_dir=""
cleanup() {
  # A process stopped with SIGSTOP gets the SIGTERM only once continued.
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || continue
    kill -CONT "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  [ -z "$pg_dir" ] || pg_stop
  rm -rf "$work"
}
trap cleanup EXIT

# free_port: prints a TCP port on 127.0.0.1 that was free a moment ago.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for_url FILE PREFIX PID: prints the URL of the first "PREFIX URL ..." line in FILE;
# fails (showing FILE and FILE.err) when PID exits first or nothing comes within 30 s.
wait_for_url() {
  local file="$1" prefix="$2" pid="$3" url=""
  for _ in $(seq 1 300); do
    url="$(sed -n "s#^$prefix \\([^ ]*\\).*#\\1#p" "$file" | head -n1)"
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "no '$prefix' line from pid $pid:" >&2
  cat "$file" "$file.err" >&2 2>/dev/null || true
  return 1
}

# start_daemon ARGS...: starts agui-serve on a free port (unless ARGS hold --port) with its
# data under $work/data and sets `daemon` to its base URL (e.g. https://127.0.0.1:PORT/agui).
start_daemon() {
  local port=(--port 0) arg
  for arg in "$@"; do case "$arg" in --port | --port=*) port=() ;; esac; done
  "$bin" "${port[@]}" --data-dir "$work/data" "$@" >"$work/daemon" 2>"$work/daemon.err" &
  pids+=($!)
  daemon="$(wait_for_url "$work/daemon" "agui-serve listening on" "$!")"
}

# pg_start: starts a throwaway PostgreSQL (the newest /usr/lib/postgresql/*/bin of the
# Debian package) in its own temporary directory: Unix socket only, in that directory, trust
# authentication, stopped and removed by the clean-up. As root it runs as the `postgres`
# user (else `nobody`), since PostgreSQL refuses to run as root. Exports AGUI_PG_URL, a
# key-value connection string (`host=<socket dir> port=N user=postgres dbname=postgres`),
# and sets `pg_bin` (the binaries' directory).
pg_start() {
  pg_bin="$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null \
    | sort -V | tail -n1 | xargs -r dirname)"
  [ -n "$pg_bin" ] || { echo "pg_start: no /usr/lib/postgresql/*/bin/initdb (Debian: postgresql)" >&2; return 1; }
  pg_as=()
  pg_dir="$(mktemp -d "${TMPDIR:-/tmp}/agui-pg.XXXXXX")"
  if [ "$(id -u)" = 0 ]; then
    local user=nobody
    id -u postgres >/dev/null 2>&1 && user=postgres
    pg_as=(runuser -u "$user" --)
    chown "$user" "$pg_dir"
  fi
  local port
  port="$(free_port)"
  # From the directory itself: initdb and pg_ctl fail in a working directory their user
  # cannot read.
  (cd "$pg_dir" && "${pg_as[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U postgres -A trust \
    -E UTF8 --locale=C --no-sync >"$pg_dir/initdb.log" 2>&1) \
    || { echo "pg_start: initdb failed:" >&2; cat "$pg_dir/initdb.log" >&2; return 1; }
  cat >>"$pg_dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$pg_dir'
port = $port
max_connections = 200
fsync = off
full_page_writes = off
CONF
  (cd "$pg_dir" && "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 30 \
    start >/dev/null) \
    || { echo "pg_start: PostgreSQL did not start:" >&2; cat "$pg_dir/server.log" >&2; return 1; }
  local ready=""
  for _ in $(seq 1 100); do
    "$pg_bin/pg_isready" -q -h "$pg_dir" -p "$port" -U postgres && { ready=1; break; }
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "pg_start: PostgreSQL not ready:" >&2; cat "$pg_dir/server.log" >&2; return 1; }
  export AGUI_PG_URL="host=$pg_dir port=$port user=postgres dbname=postgres"
}

# pg_stop: stops the PostgreSQL of pg_start at once and removes its directory (the clean-up
# calls it).
pg_stop() {
  [ -n "$pg_dir" ] || return 0
  [ ! -f "$pg_dir/data/postmaster.pid" ] \
    || (cd "$pg_dir" && "${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate -w stop) \
      >/dev/null 2>&1 || true
  rm -rf "$pg_dir"
  pg_dir=""
}
