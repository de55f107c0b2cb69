#!/usr/bin/env bash
# Compares two agui-serve binaries under the same load, interleaved: each round starts a
# fresh daemon from BIN_A, runs the load client against it, stops it, then does the same
# for BIN_B (A B A B ...). Prints the median of each measure per binary and the ratio B/A.
#
#   cargo build --release --bin agui-serve && cargo build --release --example loadgen
#   scripts/bench.sh OLD_BIN NEW_BIN [rounds]
#
# Environment: LOADGEN (the load client; default target/release/examples/loadgen),
# LOADGEN_ARGS (extra loadgen flags, e.g. "--runs 200 --http2"), DAEMON_ARGS (extra daemon
# flags), OUT (keep the raw JSON lines in this file), BENCH_TMP (where the daemons' data
# directories go; default target/). Needs python3 for the summary.
#
# Build the daemon and the client in separate cargo invocations: building them together
# unifies dev-dependency features (tokio's test-util) into the daemon.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BIN_A BIN_B [rounds]" >&2
  exit 2
fi
bin_a="$(realpath "$1")"
bin_b="$(realpath "$2")"
rounds="${3:-3}"
root="$(cd "$(dirname "$0")/.." && pwd)"
loadgen="${LOADGEN:-$root/target/release/examples/loadgen}"
for exe in "$bin_a" "$bin_b" "$loadgen"; do
  [ -x "$exe" ] || { echo "not an executable: $exe" >&2; exit 2; }
done

# Scratch space (daemon data directories) under target/, out of reach of /tmp cleaners.
mkdir -p "$root/target"
work="$(mktemp -d "${BENCH_TMP:-$root/target}/bench.XXXXXX")"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
results="${OUT:-$work/results.jsonl}"
: >"$results"

# bench_one LABEL BIN ROUND: one daemon, one load client run, the daemon stopped.
bench_one() {
  local label="$1" bin="$2" round="$3" dir="$work/$1-$3" url=""
  mkdir -p "$dir/data"
  # shellcheck disable=SC2086
  "$bin" --no-tls --port 0 --token t --data-dir "$dir/data" --max-concurrent-runs 256 \
    ${DAEMON_ARGS:-} >"$dir/stdout" 2>"$dir/stderr" &
  daemon_pid=$!
  for _ in $(seq 1 300); do
    url="$(sed -n 's#^agui-serve listening on \([^ ]*\).*#\1#p' "$dir/stdout" 2>/dev/null | head -n1 || true)"
    [ -n "$url" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "$label: the daemon did not start:" >&2
    cat "$dir/stdout" "$dir/stderr" >&2
    exit 1
  fi
  echo "round $round $label: $bin at $url (pid $daemon_pid)" >&2
  # shellcheck disable=SC2086
  "$loadgen" --url "$url" --token t --agent demo --scenario all --pid "$daemon_pid" \
    --clk-tck "$(getconf CLK_TCK)" --label "$label" --round "$round" ${LOADGEN_ARGS:-} \
    | tee -a "$results" >&2
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || true
  daemon_pid=""
  rm -rf "$dir"
}

for round in $(seq 1 "$rounds"); do
  bench_one A "$bin_a" "$round"
  bench_one B "$bin_b" "$round"
done

echo "A = $bin_a" >&2
echo "B = $bin_b" >&2
python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
measures, values, units = [], {}, {}
for row in rows:
    key = row["measure"]
    if key not in units:
        measures.append(key)
        units[key] = row["unit"]
    values.setdefault((key, row["label"]), []).append(row["value"])
    for flag in ("incomplete", "failed"):
        if row.get(flag):
            print(f"warning: {row['label']} round {row['round']} {key}: {flag} = {row[flag]}")
def fmt(x):
    return f"{x:.4g}" if x == x else "-"
print(f"{'measure':32} {'unit':16} {'A median':>10} {'B median':>10} {'B/A':>6}   A min..max / B min..max")
for key in measures:
    a, b = values.get((key, "A"), []), values.get((key, "B"), [])
    ma = statistics.median(a) if a else float("nan")
    mb = statistics.median(b) if b else float("nan")
    ratio = mb / ma if a and b and ma else float("nan")
    spread = f"{fmt(min(a))}..{fmt(max(a))} / {fmt(min(b))}..{fmt(max(b))}" if a and b else ""
    print(f"{key:32} {units[key]:16} {fmt(ma):>10} {fmt(mb):>10} {ratio:6.3f}   {spread}")
EOF
