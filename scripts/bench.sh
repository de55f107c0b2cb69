#!/usr/bin/env bash
# The benchmark: the same load, from the one load client (examples/loadgen.rs), against
# several servers over loopback, in interleaved rounds (a fresh server for every measure
# group, in turn, each round starting one server later: H N A, N A H, A H N, ...). Prints, for every measure, each server's min/median/max
# and the median of the last server with its ratio to each of the others.
#
#   scripts/bench.sh [rounds]                  # the full benchmark (default 3 rounds)
#   scripts/bench.sh --quick                   # every measure, one round, smaller counts
#   scripts/bench.sh BIN_A BIN_B [rounds]      # two daemon builds, A B, B A, ..., ratio B/A
#
# --quick runs every measure of the full benchmark, against the same baselines, once: the
# one-stream, concurrent and short-run measures as the full run has them (they take
# seconds), the others with the same runs (events per run, sizes) but fewer of them
# (LOADGEN_ARGS below), one idle level (2,000 streams), two conversations per real-agent
# configuration, 5 s of settling. Its ratios are noisier than a full run's (one round); it
# leaves docs/benchmark.md as it is.
#
# With no BIN it builds what it needs and compares agui-serve with baselines that answer the
# demo agent's requests with the same events and sizes but have no runtime:
#   hyper            examples/bare_sse.rs, a bare hyper SSE server, one body chunk per frame;
#   hyper-durable    the same with `--mode durable`: before RUN_STARTED it commits the run's
#                    start (thread, input, run), before RUN_FINISHED its answer and end,
#                    with the daemon's own store (SQLite, WAL, group commit, checkpoints
#                    off the commit path): what commit-then-announce costs with no runtime
#                    (ttfe and storm only; short runs are read against it);
#   hyper-coalesced  the same with `--mode coalesced`: each body chunk is a frame with the
#                    frames already pending after it, up to 16 kB, as agui-serve's
#                    attachment coalesces them (one-stream and concurrent only);
#   raw-tcp          the same with `--mode raw-tcp`: no HTTP, a plain tokio TCP writer and
#                    the load client's reader, the same frame bytes in writes of up to 16 kB:
#                    the ceiling of loopback (one-stream and concurrent only);
#   node             bench/node/server.mjs, Node's plain http with the official AG-UI
#                    encoder (@ag-ui/encoder, pinned), installed with `npm ci` into
#                    bench/node/ (only where node and npm are installed; skipped otherwise);
#   agui-serve       target/release/agui-serve.
# Every ratio is agui-serve's median over a baseline's median, both from this run; the output
# names the baseline of each ratio column.
# A BIN is any executable that takes agui-serve's command line and prints its "agui-serve
# listening on URL" line: a daemon build, or a baseline (target/release/examples/bare_sse,
# bench/node/server.mjs).
#
# Measure groups, each on a fresh server (so that one group's memory does not weigh on the
# next): one-stream, concurrent, ttfe, storm and paced together; idle once per level of
# IDLE_STREAMS (a fresh server per level, so agui-serve's 30 s disconnect grace never keeps
# a level's runs alive into the next); rss-after. See examples/loadgen.rs for each measure.
#
# The real-agent phase (scenario real-agent; full benchmark only) runs where the real Claude
# Code adapter is installed (AGUI_REAL_AGENTS, default target/tools/real-agents, the folder
# `scripts/real-agents.sh --install-only` installs it into and prints; AGUI_REAL_AGENTS=
# (empty) skips it): agui-serve with Claude Code on the scripted model
# (examples/scripted_model.rs), once per round and per configuration (warm starts: a spare
# per principal and the recent threads' sessions loaded at start-up; then none; then none
# under bwrap, reported also against the same turns under Landlock alone; then none with
# no model relay, the key in the agent's environment, which the relay's turns are
# reported against), the model reached through a relay but in the last: new
# threads' first turns and warm turns (loadgen's agent-turns), then the daemon restarted on
# the same data and each thread's next turn (agent-restart). Reported as medians and as
# ratios to the same configuration's warm turn. Then threads at once (loadgen's
# agent-parallel): 1, 5 and 20 (PARALLEL_THREADS) new threads taking turns together under
# the default confinement, with the daemon's and the adapters' CPU per turn, resident sizes
# and the processes left once the idle sessions were closed. Without the adapter it says
# so and goes on.
#
# Environment: SCENARIOS (comma-separated loadgen scenarios and real-agent; default all),
# AGENT_SETTLE (seconds the real-agent phase waits after each daemon start; default 15),
# IDLE_STREAMS (idle levels; default "2000 10000"), LOADGEN (the load client; default
# target/release/examples/loadgen), LOADGEN_ARGS (extra loadgen flags), DAEMON_ARGS (extra
# server flags), OUT (keep the raw JSON lines in this file), BENCH_TMP (where the servers'
# data directories go; default target/), BENCH_DOC (below). Needs python3 for the summary.
# The soft limit on open files is raised to the hard limit (the idle measure holds 10 000
# connections).
#
# A full run (no BIN; SCENARIOS, IDLE_STREAMS, LOADGEN_ARGS and DAEMON_ARGS unset; no
# failure) also rewrites the results table of docs/benchmark.md: the lines between
# `<!-- bench:begin -->` and `<!-- bench:end -->`, the rest of the file kept.
# BENCH_DOC=FILE writes FILE instead; BENCH_DOC= (empty) writes nothing.
#
# Build the daemon and the client in separate cargo invocations: building them together
# unifies dev-dependency features (tokio's test-util) into the daemon.
set -euo pipefail

usage() {
  echo "usage: $0 [rounds] | $0 --quick | $0 BIN_A BIN_B [rounds]" >&2
  exit 2
}
is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

root="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = --quick ]; then
  shift
  [ $# -eq 0 ] || usage
  set -- 1
  IDLE_STREAMS="${IDLE_STREAMS:-2000}"
  AGENT_SETTLE="${AGENT_SETTLE:-5}"
  LOADGEN_ARGS="${LOADGEN_ARGS:---storm-streams 200 --paced-streams 200 --rss-runs 300 --warmup 10 --turn-threads 2 --warm-turns 2}"
  BENCH_DOC=""
fi
loadgen="${LOADGEN:-$root/target/release/examples/loadgen}"
labels=()
bins=()
# Per server: extra flags, the scenarios it serves (empty: all), what it is.
extras=()
onlys=()
abouts=()
full=""
# add_server LABEL BIN EXTRA_FLAGS ONLY ABOUT
add_server() {
  labels+=("$1")
  bins+=("$2")
  extras+=("$3")
  onlys+=("$4")
  abouts+=("$5")
}

if [ $# -le 1 ]; then
  full=1
  rounds="${1:-3}"
  is_count "$rounds" || usage
  (cd "$root" && cargo build --release --bin agui-serve)
  (cd "$root" && cargo build --release --example loadgen --example bare_sse --example scripted_model)
  bare="$root/target/release/examples/bare_sse"
  add_server hyper "$bare" "" "" "bare hyper, one body chunk per frame (examples/bare_sse.rs)"
  add_server hyper-durable "$bare" "--mode durable" "ttfe,storm" \
    "bare hyper committing what agui-serve commits before announcing (the run's start before RUN_STARTED, its answer and end before RUN_FINISHED; the daemon's store, group commit); the baseline of short runs (bare_sse --mode durable)"
  add_server hyper-coalesced "$bare" "--mode coalesced" "one-stream,concurrent" \
    "bare hyper, pending frames coalesced into chunks of up to 16 kB as agui-serve does (bare_sse --mode coalesced)"
  add_server raw-tcp "$bare" "--mode raw-tcp" "one-stream,concurrent" \
    "no HTTP: a plain tokio TCP writer and reader, the same frame bytes, writes of up to 16 kB; the ceiling (bare_sse --mode raw-tcp)"
  node_dir="$root/bench/node"
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    # npm ci only when the lock file changed since the last install.
    stamp="$node_dir/node_modules/.bench-lock"
    if cmp -s "$node_dir/package-lock.json" "$stamp" \
      || { (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error) \
        && cp "$node_dir/package-lock.json" "$stamp"; }; then
      add_server node "$node_dir/server.mjs" "" "" \
        "Node's http with the official @ag-ui/encoder (bench/node/server.mjs)"
    else
      echo "warning: npm ci failed in $node_dir: no Node baseline" >&2
    fi
  else
    echo "warning: node/npm not installed: no Node baseline" >&2
  fi
  add_server agui-serve "$root/target/release/agui-serve" "" "" "the daemon, demo agent"
elif [ $# -le 3 ]; then
  rounds="${3:-3}"
  is_count "$rounds" || usage
  add_server A "$(realpath "$1")" "" "" "build A"
  add_server B "$(realpath "$2")" "" "" "build B"
else
  usage
fi
for exe in "${bins[@]}" "$loadgen"; do
  [ -x "$exe" ] || { echo "not an executable: $exe" >&2; exit 2; }
done

# Every open stream is a socket on both sides.
hard="$(ulimit -Hn)"
[ "$hard" = unlimited ] && hard=1048576
ulimit -n "$hard" 2>/dev/null || echo "warning: could not raise ulimit -n to $hard" >&2
echo "open files limit: $(ulimit -n)" >&2

scenarios="${SCENARIOS:-one-stream,concurrent,ttfe,storm,paced,idle,rss-after,real-agent}"
read -r -a idle_levels <<<"${IDLE_STREAMS:-2000 10000}"
# The groups of loadgen flags, each run on a fresh server.
groups=()
main=""
real_agent=""
for scenario in ${scenarios//,/ }; do
  case "$scenario" in
    one-stream | concurrent | ttfe | storm | paced) main="${main:+$main,}$scenario" ;;
    idle) for n in "${idle_levels[@]}"; do groups+=("--scenario idle --idle-streams $n"); done ;;
    rss-after) groups+=("--scenario rss-after") ;;
    real-agent) if [ -n "$full" ]; then real_agent=1; fi ;;
    *) echo "unknown scenario: $scenario" >&2; exit 2 ;;
  esac
done
if [ -n "$main" ]; then groups=("--scenario $main" "${groups[@]}"); fi

# group_for I GROUP: the flags of GROUP for server I, its scenarios narrowed to those the
# server serves; nothing when it serves none of them.
group_for() {
  local only="${onlys[$1]}" group="$2" words kept="" scenario
  if [ -z "$only" ]; then
    echo "$group"
    return 0
  fi
  read -r -a words <<<"$group"
  [ "${words[0]}" = --scenario ] || return 0
  for scenario in ${words[1]//,/ }; do
    case ",$only," in *",$scenario,"*) kept="${kept:+$kept,}$scenario" ;; esac
  done
  if [ -n "$kept" ]; then echo "--scenario $kept${words[2]:+ ${words[*]:2}}"; fi
}

# Scratch space (the servers' data directories) under target/, out of reach of /tmp cleaners.
mkdir -p "$root/target"
work="$(mktemp -d "${BENCH_TMP:-$root/target}/bench.XXXXXX")"
server_pid=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  # agui-serve waits for live runs (idle streams) up to its shutdown grace: not that long.
  for _ in $(seq 1 50); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
cleanup() {
  stop_server
  if [ -n "${model_pid:-}" ]; then kill -TERM "$model_pid" 2>/dev/null || true; wait "$model_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
# A bearer token of a real one's length: agui-serve scrubs the token from every log line,
# and a one-letter token would have it rewrite every line's every occurrence of that letter.
token="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
results="${OUT:-$work/results.jsonl}"
: >"$results"
failures="$work/failures"
: >"$failures"

# start_server LABEL BIN DIR FLAGS...: starts a server with its data in DIR/data, sets
# server_pid and server_url; exits when it does not start.
start_server() {
  local label="$1" bin="$2" dir="$3"
  shift 3
  mkdir -p "$dir/data"
  "$bin" --no-tls --port 0 --token "$token" --data-dir "$dir/data" "$@" \
    >"$dir/stdout" 2>"$dir/stderr" &
  server_pid=$!
  server_url=""
  for _ in $(seq 1 300); do
    server_url="$(sed -n 's#^agui-serve listening on \([^ ]*\).*#\1#p' "$dir/stdout" 2>/dev/null | head -n1 || true)"
    [ -n "$server_url" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$server_url" ]; then
    echo "$label: the server did not start:" >&2
    cat "$dir/stdout" "$dir/stderr" >&2
    exit 1
  fi
}

# load LABEL ROUND WHAT DIR FLAGS...: one load client run against the running server (its
# JSON lines into the results); a failure of the client or the server is recorded.
load() {
  local label="$1" round="$2" what="$3" dir="$4"
  shift 4
  # shellcheck disable=SC2086
  if ! "$loadgen" --url "$server_url" --token "$token" "$@" --pid "$server_pid" \
    --clk-tck "$(getconf CLK_TCK)" --label "$label" --round "$round" ${LOADGEN_ARGS:-} \
    | tee -a "$results" >&2; then
    echo "round $round $label ($what): the load client failed" | tee -a "$failures" >&2
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "round $round $label ($what): the server died; its stderr ends:" | tee -a "$failures" >&2
    tail -n 20 "$dir/stderr" | tee -a "$failures" >&2
  fi
}

# bench_one I ROUND GROUP: a fresh server I, one load client run, the server stopped.
bench_one() {
  local label="${labels[$1]}" bin="${bins[$1]}" round="$2" group="$3" dir
  dir="$(mktemp -d "$work/$label-$round.XXXXXX")"
  # shellcheck disable=SC2086
  start_server "$label" "$bin" "$dir" --max-concurrent-runs 20000 --max-connections 20000 \
    ${extras[$1]} ${DAEMON_ARGS:-}
  echo "round $round $label ($group): $bin${extras[$1]:+ ${extras[$1]}} at $server_url (pid $server_pid)" >&2
  # shellcheck disable=SC2086
  load "$label" "$round" "$group" "$dir" --agent demo $group
  stop_server
  rm -rf "$dir"
}

# The real-agent phase's scripted model and configuration (once), then per round:
# agent_round ROUND.
agent_tools="${AGUI_REAL_AGENTS-$root/target/tools/real-agents}"
agent_settle="${AGENT_SETTLE:-15}"
agent_note=""
if [ -n "$real_agent" ] && [ -z "$agent_tools" ]; then
  agent_note="real-agent phase skipped: AGUI_REAL_AGENTS is empty"
elif [ -n "$real_agent" ] && [ ! -x "$agent_tools/node_modules/.bin/claude-agent-acp" ]; then
  agent_note="real-agent phase skipped: no Claude Code adapter in $agent_tools; scripts/real-agents.sh --install-only installs it"
fi
if [ -n "$agent_note" ]; then
  echo "$agent_note" >&2
  real_agent=""
fi
model_pid=""
if [ -n "$real_agent" ]; then
  # The scripted model answers every turn of loadgen's agent-turns (its TURN_MARKER) with
  # its TURN_REPLY.
  echo '{"bench-turn": [{"say": "Done."}]}' >"$work/scripts.json"
  "$root/target/release/examples/scripted_model" "$work/scripts.json" >"$work/model" 2>"$work/model.err" &
  model_pid=$!
  model_url=""
  for _ in $(seq 1 300); do
    model_url="$(sed -n 's#^scripted model listening on \([^ ]*\).*#\1#p' "$work/model" | head -n1)"
    [ -n "$model_url" ] && break
    kill -0 "$model_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$model_url" ] || { echo "the scripted model did not start:" >&2; cat "$work/model.err" >&2; exit 1; }
  # Claude Code as tests/real_agents.rs and scripts/browser-real-agents.sh run it: each
  # thread its own workspace and confined process, mode "default", its model reached
  # through a relay (the key added outside its sandbox); agent.toml with warm starts (a
  # spare per principal, the recent threads' sessions loaded at start-up), agent-cold.toml
  # without, agent-bwrap.toml without and under bwrap (user, mount, PID, IPC and UTS
  # namespaces too) instead of Landlock alone, agent-direct.toml without and with no relay
  # (the key in its environment, the model's loopback port forwarded as it is).
  echo "sk-ant-scripted" >"$work/model.key"
  for config in agent agent-cold agent-bwrap agent-direct agent-parallel; do
    cat >"$work/$config.toml" <<TOML
[[agents]]
name = "claude"
kind = "acp"
command = ["$agent_tools/node_modules/.bin/claude-agent-acp"]
permissions = "ask"
mode = "default"
workspace = { source = "empty" }
TOML
    # Each names its confinement (the default is bwrap where it works): bwrap against
    # Landlock alone is a ratio of its own.
    case "$config" in
      agent) printf 'spares = 1\npreload_sessions = 8\nconfinement = "landlock"\n' >>"$work/$config.toml" ;;
      agent-bwrap) printf 'confinement = "bwrap"\n' >>"$work/$config.toml" ;;
      # Threads at once, confined by default; idle sessions closed (and their processes
      # stopped) 20 s after their last turn, so what an idle thread holds is seen.
      agent-parallel) printf 'session_ttl = "20s"\npool_size = 32\n' >>"$work/$config.toml" ;;
      *) printf 'confinement = "landlock"\n' >>"$work/$config.toml" ;;
    esac
    if [ "$config" = agent-direct ]; then
      cat >>"$work/$config.toml" <<TOML
env = { ANTHROPIC_BASE_URL = "$model_url", ANTHROPIC_API_KEY = "sk-ant-scripted", IS_SANDBOX = "1", DISABLE_AUTOUPDATER = "1", DISABLE_TELEMETRY = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }
sandbox = { read = ["$agent_tools"], connect = [${model_url##*:}] }
TOML
    else
      cat >>"$work/$config.toml" <<TOML
env = { IS_SANDBOX = "1", DISABLE_AUTOUPDATER = "1", DISABLE_TELEMETRY = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }
sandbox = { read = ["$agent_tools"] }

[[agents.relay]]
upstream = "$model_url"
header = "x-api-key"
secret_file = "$work/model.key"
base_url_env = "ANTHROPIC_BASE_URL"
placeholder_env = "ANTHROPIC_API_KEY"
TOML
    fi
  done
fi
# agent_phase ROUND CONFIG [TAG]: the real agent's turns on a daemon with CONFIG (its
# measures named agent_TAG_... when TAG is given), then on the daemon restarted.
agent_phase() {
  local round="$1" config="$2" tag="${3:-}" dir bin="$root/target/release/agui-serve"
  dir="$(mktemp -d "$work/real-agent-$round.XXXXXX")"
  start_server agui-serve "$bin" "$dir" --config "$work/$config.toml"
  echo "round $round agui-serve (real agent, $config): new threads and warm turns at $server_url (pid $server_pid)" >&2
  load agui-serve "$round" "real agent, $config" "$dir" --agent claude --scenario agent-turns \
    --turns-file "$dir/turns.json" --settle "$agent_settle" ${tag:+--turns-tag "$tag"}
  stop_server
  if [ -s "$dir/turns.json" ]; then
    start_server agui-serve "$bin" "$dir" --config "$work/$config.toml"
    echo "round $round agui-serve (real agent, $config): restarted at $server_url (pid $server_pid)" >&2
    load agui-serve "$round" "real agent, $config, restarted" "$dir" --agent claude \
      --scenario agent-restart --turns-file "$dir/turns.json" --settle "$agent_settle" \
      ${tag:+--turns-tag "$tag"}
    stop_server
  fi
  rm -rf "$dir"
}
# agent_parallel_phase ROUND: 1, 5 and 20 threads (PARALLEL_THREADS) taking turns at once
# on one daemon (agent-parallel.toml), then its processes counted after the idle sessions
# were closed.
agent_parallel_phase() {
  local round="$1" dir bin="$root/target/release/agui-serve"
  dir="$(mktemp -d "$work/real-parallel-$round.XXXXXX")"
  start_server agui-serve "$bin" "$dir" --config "$work/agent-parallel.toml" --max-concurrent-runs 64 \
    --max-runs-per-principal 64
  echo "round $round agui-serve (real agent, threads at once): at $server_url (pid $server_pid)" >&2
  load agui-serve "$round" "real agent, threads at once" "$dir" --agent claude --scenario agent-parallel \
    --parallel-threads "${PARALLEL_THREADS:-1,5,20}" --warm-turns 2 --settle "$agent_settle" --idle-wait 40
  stop_server
  rm -rf "$dir"
}
agent_round() {
  agent_phase "$1" agent
  agent_phase "$1" agent-cold cold
  agent_phase "$1" agent-bwrap bwrap
  agent_phase "$1" agent-direct direct
  agent_parallel_phase "$1"
}

started=$SECONDS
# Each round starts one server later than the one before (A B C, B C A, C A B, ...), so
# that no server always runs right after the same one (a storm of new connections leaves
# the machine busier for the next server for a while).
servers=${#labels[@]}
for round in $(seq 1 "$rounds"); do
  for group in "${groups[@]}"; do
    for k in $(seq 0 $((servers - 1))); do
      i=$(((k + round - 1) % servers))
      this="$(group_for "$i" "$group")"
      if [ -n "$this" ]; then bench_one "$i" "$round" "$this"; fi
    done
  done
  if [ -n "$real_agent" ]; then agent_round "$round"; fi
done

echo >&2
for i in "${!labels[@]}"; do
  echo "${labels[$i]} = ${bins[$i]}${extras[$i]:+ ${extras[$i]}}" >&2
done
echo "$rounds rounds in $((SECONDS - started)) s on $(nproc) cores" >&2
cat "$failures"
# The results table of docs/benchmark.md: rewritten by a full run only.
doc="${BENCH_DOC-$root/docs/benchmark.md}"
if [ -n "$doc" ] && { [ -z "$full" ] || [ -s "$failures" ] \
  || [ -n "${SCENARIOS:-}${IDLE_STREAMS:-}${LOADGEN_ARGS:-}${DAEMON_ARGS:-}" ]; }; then
  echo "not a full run: $doc left as it is" >&2
  doc=""
fi
node_version="$(node --version 2>/dev/null || true)"
memory="$(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
run_line="\`scripts/bench.sh $rounds\` on $(date -u +%Y-%m-%d): $rounds rounds, $(nproc) cores, $memory"
run_line="$run_line${node_version:+, Node ${node_version#v}}; medians."
about="$(for i in "${!labels[@]}"; do printf '%s\t%s\n' "${labels[$i]}" "${abouts[$i]}"; done)"
BENCH_DOC="$doc" BENCH_HEAD="$run_line" BENCH_ABOUT="$about" BENCH_AGENT_NOTE="$agent_note" \
  python3 - "$results" "${labels[@]}" <<'EOF'
import json, os, statistics, sys
path, labels = sys.argv[1], sys.argv[2:]
subject, refs = labels[-1], labels[:-1]
about = dict(line.split("\t", 1) for line in os.environ.get("BENCH_ABOUT", "").splitlines() if "\t" in line)
rows = [json.loads(line) for line in open(path) if line.strip()]
# The real-agent phase's measures (agent_<kind>_<what>_ms) have a table of their own.
AGENT = "agent_"
measures, values, units = [], {}, {}
for row in rows:
    key = row["measure"]
    if key not in units:
        if not key.startswith(AGENT):
            measures.append(key)
        units[key] = row["unit"]
    values.setdefault((key, row["label"]), []).append(row["value"])
    for flag in ("incomplete", "failed", "ended_early"):
        if row.get(flag):
            print(f"warning: {row['label']} round {row['round']} {key}: {flag} = {row[flag]}"
                  + (f" ({row['first_error']})" if row.get("first_error") else ""))
nan = float("nan")
def fmt(x):
    if x != x:
        return "-"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g} M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g} k"
    return f"{x:.4g}"
def fmt_ratio(x):
    return f"{x:.3f}" if x == x else "-"
def median(key, label):
    v = values.get((key, label), [])
    return statistics.median(v) if v else nan
def ratio(key, label):
    a, b = median(key, subject), median(key, label)
    return a / b if a == a and b == b and b else nan
def spread(key, label):
    v = values.get((key, label), [])
    return f"{fmt(min(v))}/{fmt(median(key, label))}/{fmt(max(v))}" if v else "-"
legend = [f"{subject}/{ref}: {subject}'s median over the median of {ref}, {about.get(ref, ref)}"
          for ref in refs]
print(f"{subject}: {about.get(subject, subject)}; ratios from this run's interleaved rounds:")
print("\n".join("  " + line for line in legend))
print()
head = f"{'measure':30} {'unit':16} {subject + ' median':>17}"
head += "".join(f" {subject + '/' + ref:>17}" for ref in refs)
print(head + "   " + " | ".join(f"{label} min/median/max" for label in labels))
for key in measures:
    line = f"{key:30} {units[key]:16} {fmt(median(key, subject)):>17}"
    line += "".join(f" {fmt_ratio(ratio(key, ref)):>17}" for ref in refs)
    print(line + "   " + " | ".join(spread(key, label) for label in labels))
print()
table = [f"| measure | unit | {subject} | " + " | ".join(f"/ {ref}" for ref in refs)
         + " | " + " | ".join(f"{label} min..max" for label in labels) + " |",
         "|---" * (3 + len(refs) + len(labels)) + "|"]
for key in measures:
    cells = [key, units[key], fmt(median(key, subject))]
    cells += [fmt_ratio(ratio(key, ref)) for ref in refs]
    for label in labels:
        v = values.get((key, label), [])
        cells.append(f"{fmt(min(v))}..{fmt(max(v))}" if v else "-")
    table.append("| " + " | ".join(cells) + " |")
print("\n".join(table))

# The real-agent phase: each kind of turn's medians over the rounds, and its ratio to the
# warm turn (a turn on the thread's live agent process and session) of the same
# configuration: with warm starts (spares, sessions loaded at start-up), then without
# (measures tagged cold_).
KINDS = [("new_thread", "new thread's first turn"), ("warm", "warm turn"),
         ("restart", "first turn after a restart")]
CONFIGS = [("", "warm starts"), ("cold_", "no warm starts"),
           ("bwrap_", "no warm starts, bwrap"), ("direct_", "no warm starts, no relay")]
WHATS = [("first_event", "first event"), ("first_text", "first text"), ("turn", "whole turn")]
def agent(tag, kind, what):
    return median(f"{AGENT}{tag}{kind}_{what}_ms", subject)
agent_table = []
if any(key.startswith(AGENT) for key in units):
    agent_table = ["| turn | " + " | ".join(f"{name} ms" for _, name in WHATS) + " | "
                   + " | ".join(f"{name} / warm" for _, name in WHATS) + " |",
                   "|---" * (1 + 2 * len(WHATS)) + "|"]
    print()
    print(f"real agent: Claude Code on the scripted model behind {subject}, medians over the rounds, ratios to the warm turn")
    print(f"{'turn':46}" + "".join(f" {name + ' ms':>15}" for _, name in WHATS)
          + "".join(f" {name + ' / warm':>20}" for _, name in WHATS))
    for tag, config in CONFIGS:
        if not any(key.startswith(f"{AGENT}{tag}warm_") for key in units):
            continue
        for kind, kind_name in KINDS:
            name = f"{kind_name}, {config}"
            ms = [agent(tag, kind, what) for what, _ in WHATS]
            ratios = [a / w if a == a and w == w and w else nan
                      for a, w in zip(ms, [agent(tag, "warm", what) for what, _ in WHATS])]
            print(f"{name:46}" + "".join(f" {fmt(x):>15}" for x in ms)
                  + "".join(f" {fmt_ratio(x):>20}" for x in ratios))
            agent_table.append(f"| {name} | " + " | ".join(fmt(x) for x in ms) + " | "
                               + " | ".join(fmt_ratio(x) for x in ratios) + " |")
    # Spares are made in the background while the warm turns run: the warm-start turns also
    # against the warm turn of the configuration that makes nothing.
    if all(any(key.startswith(f"{AGENT}{tag}warm_") for key in units) for tag in ("", "cold_")):
        for kind, kind_name in KINDS:
            name = f"{kind_name}, warm starts / warm turn, no warm starts"
            ratios = [a / w if a == a and w == w and w else nan
                      for a, w in ((agent("", kind, what), agent("cold_", "warm", what))
                                   for what, _ in WHATS)]
            print(f"{name:46}" + "".join(f" {'':>15}" for _ in WHATS)
                  + "".join(f" {fmt_ratio(x):>20}" for x in ratios))
            agent_table.append(f"| {name} | " + " | ".join("" for _ in WHATS) + " | "
                               + " | ".join(fmt_ratio(x) for x in ratios) + " |")
    # What the namespaces cost (each kind of turn under bwrap against the same turn under
    # Landlock alone) and what the relay costs (each kind of turn through the relay against
    # the same turn with the model's port forwarded as it is); all without warm starts (a
    # new thread's first turn starts the agent).
    for tag, base, label in (("bwrap_", "cold_", "bwrap / landlock"), ("cold_", "direct_", "relay / direct")):
        if not all(any(key.startswith(f"{AGENT}{t}warm_") for key in units) for t in (tag, base)):
            continue
        for kind, kind_name in KINDS:
            name = f"{kind_name}, {label}"
            ratios = [a / w if a == a and w == w and w else nan
                      for a, w in ((agent(tag, kind, what), agent(base, kind, what))
                                   for what, _ in WHATS)]
            print(f"{name:46}" + "".join(f" {'':>15}" for _ in WHATS)
                  + "".join(f" {fmt_ratio(x):>20}" for x in ratios))
            agent_table.append(f"| {name} | " + " | ".join("" for _ in WHATS) + " | "
                               + " | ".join(fmt_ratio(x) for x in ratios) + " |")
    # Threads taking turns at once (agent-parallel): one row per count.
    prefix = f"{AGENT}parallel"
    counts = sorted({int(k[len(prefix):].split("_")[0]) for k in units
                     if k.startswith(prefix) and k[len(prefix):].split("_")[0].isdigit()})
    if counts:
        cols = [("first_first_text_p50_ms", "new thread first text p50 ms"),
                ("first_first_text_p99_ms", "p99 ms"),
                ("warm_first_text_p50_ms", "warm turn first text p50 ms"),
                ("warm_first_text_p99_ms", "p99 ms"),
                ("warm_turn_p50_ms", "warm turn p50 ms"),
                ("daemon_cpu_per_turn_ms", "daemon CPU per turn ms"),
                ("agents_cpu_per_turn_ms", "adapters' CPU per turn ms"),
                ("agents_pss_per_thread_mib", "adapter PSS per thread MiB"),
                ("daemon_rss_per_thread_kib", "daemon RSS per live thread KiB"),
                ("processes_after_idle", "agent processes after session_ttl")]
        agent_table += ["", "| threads at once | " + " | ".join(n for _, n in cols) + " |",
                        "|---|" + "---|" * len(cols)]
        for n in counts:
            row = [median(f"{prefix}{n}_{key}", subject) for key, _ in cols]
            agent_table.append(f"| {n} | " + " | ".join(fmt(x) for x in row) + " |")
    print()
    print("\n".join(agent_table))
agent_note = os.environ.get("BENCH_AGENT_NOTE", "")
if agent_note:
    print()
    print(agent_note)

# The lines between the markers of BENCH_DOC become the run's line and its table.
doc = os.environ.get("BENCH_DOC", "")
if doc:
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    lines = open(doc).read().split("\n") if os.path.isfile(doc) else []
    if begin not in lines or end not in lines[lines.index(begin):]:
        sys.exit(f"{doc}: no {begin} ... {end} lines; left as it is")
    first = lines.index(begin)
    last = lines.index(end, first)
    block = [os.environ["BENCH_HEAD"], ""] + [f"- {line}" for line in legend] + [""] + table
    if agent_table:
        block += ["", f"Real agent: Claude Code on the scripted model behind {subject}, medians, ratios to the warm turn:", ""]
        block += agent_table
    elif agent_note:
        block += ["", agent_note[0].upper() + agent_note[1:] + "."]
    lines[first + 1:last] = block
    with open(doc + ".tmp", "w") as out:
        out.write("\n".join(lines))
    os.replace(doc + ".tmp", doc)
    print(f"results table written to {doc}", file=sys.stderr)
EOF
