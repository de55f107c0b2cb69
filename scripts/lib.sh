# Sourced by the test scripts. Sets `work` (a scratch directory) and `pids` (background
# processes); both are cleaned up on exit. Needs `bin` (the agui-serve binary) for
# start_daemon.
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

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

# start_daemon ARGS...: starts agui-serve on a free port with its data under $work/data
# and sets `daemon` to its base URL (e.g. https://127.0.0.1:PORT/agui).
start_daemon() {
  "$bin" --port 0 --data-dir "$work/data" "$@" >"$work/daemon" 2>"$work/daemon.err" &
  pids+=($!)
  daemon="$(wait_for_url "$work/daemon" "agui-serve listening on" "$!")"
}
