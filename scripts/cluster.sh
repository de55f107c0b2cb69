#!/usr/bin/env bash
# Three agui-serve nodes (A, B, C) sharing one throwaway PostgreSQL, and what a cluster
# promises: a run reattached exactly through another node, every node listing every node's
# threads, a killed owner's thread taken over (resync, run interrupted, the thread goes on),
# a paused owner fenced out once its lease is gone (LEASE_LOST, nothing more stored), each
# webhook event delivered once by two nodes sharing the outbox, each schedule occurrence
# fired by one node (tests/schedules.rs); then the conformance suite against node B on the
# same database. Needs python3 and PostgreSQL's
# server (Debian: postgresql). Usage: scripts/cluster.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || (cd "$root" && cargo build --bin agui-serve)
source "$root/scripts/lib.sh"

ttl=3 # seconds: the nodes' --lease-ttl
declare -A url pid

# On failure: the tail of every node's log and PostgreSQL's, then the usual clean-up.
on_exit() {
  local status=$?
  if [ "$status" -ne 0 ]; then
    for log in "$work"/node-*.out "$work"/node-*.err ${pg_dir:+"$pg_dir/server.log"}; do
      [ -s "$log" ] || continue
      echo "---- tail of ${log##*/}" >&2
      tail -n 40 "$log" >&2
    done
    echo "FAIL: scripts/cluster.sh (exit $status)" >&2
  fi
  cleanup
  exit "$status"
}
trap on_exit EXIT

# start_node LABEL NODE_ID [https]: a node on a free port (plain HTTP unless https: then its
# generated certificate), its data in $work/NODE_ID, its output in
# $work/node-LABEL.{out,err}; sets url[LABEL] and pid[LABEL].
start_node() {
  local label="$1" id="$2" scheme="${3:-http}" port tls=(--no-tls)
  [ "$scheme" = https ] && tls=()
  port="$(free_port)"
  "$bin" "${tls[@]}" --port "$port" --token-file "$work/token" --data-dir "$work/$id" \
    --store "$AGUI_PG_URL" --node-id "$id" --advertise-url "$scheme://127.0.0.1:$port" \
    --lease-ttl "${ttl}s" >"$work/node-$label.out" 2>"$work/node-$label.err" &
  pids+=($!)
  pid[$label]=$!
  url[$label]="$(wait_for_url "$work/node-$label.out" "agui-serve listening on" "$!")" \
    || { echo "FAIL node $label ($id) did not start" >&2; return 1; }
  echo "ok   node $label (--node-id $id) on ${url[$label]}"
}
checks() { python3 "$root/scripts/cluster_check.py" "$work/token" "$@"; }

pg_start
echo "ok   PostgreSQL ($("$pg_bin/postgres" --version | awk '{print $3}')) on $AGUI_PG_URL"
# The PostgreSQL store's own tests (ignored by a plain `cargo test`: they need a server).
(cd "$root" && AGUI_TEST_PG_URL="$AGUI_PG_URL" cargo test --locked --test pg_store -- --ignored)
# Two nodes delivering one outbox's webhooks: each event reaches the receiver once.
(cd "$root" && AGUI_TEST_PG_URL="$AGUI_PG_URL" cargo test --locked --test webhooks -- --ignored)
# Two in-process nodes sharing one schedule: each occurrence fired by exactly one of them.
(cd "$root" && AGUI_TEST_PG_URL="$AGUI_PG_URL" cargo test --locked --test schedules -- --ignored)
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$work/token"
for node in A B C; do start_node "$node" "$node"; done

checks exact "${url[A]}" "${url[B]}"
checks listing "${url[A]}" "${url[B]}" "${url[C]}"
checks kill "${url[A]}" "${pid[A]}" "${url[B]}" "${url[C]}" "$ttl"
wait "${pid[A]}" 2>/dev/null || true
# A restarted (same node id and data directory, a new port) owns the next run.
start_node A2 A
checks stop "${url[A2]}" "${pid[A2]}" "${url[B]}" "${url[C]}" "$ttl"
checks orphan "${url[A2]}" "${pid[A2]}" "${url[B]}" "$ttl"
wait "${pid[A2]}" 2>/dev/null || true

# Two nodes serving HTTPS with their own generated (self-signed) certificates: requests
# between them are verified against the certificate each published in the database.
for label in D E; do start_node "$label" "$label" https; done
hostport() { local rest="${1#*://}"; echo "${rest%%/*}"; }
export CLUSTER_CA="$(hostport "${url[D]}")=$work/D/tls/cert.pem $(hostport "${url[E]}")=$work/E/tls/cert.pem"
checks tls-exact "${url[D]}" "${url[E]}"

# The conformance suite against node B, on the same database: B is stopped, and the suite's
# own daemon (TLS, its config and token) comes up as node B in its place.
kill -TERM "${pid[B]}"
wait "${pid[B]}" || { echo "FAIL node B did not shut down cleanly" >&2; exit 1; }
echo "ok   node B stopped; the conformance suite's daemon serves as node B"
port="$(free_port)"
AGUI_DAEMON_ARGS="--port $port --store $(printf '%q' "$AGUI_PG_URL") --node-id B \
--advertise-url https://127.0.0.1:$port --lease-ttl ${ttl}s" "$root/scripts/conformance.sh" "$bin"
echo "ok: a cluster of three nodes on PostgreSQL: exact reattach across nodes, one thread list, takeover of a dead owner, fencing of a paused one, conformance on node B"
