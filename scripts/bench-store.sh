#!/usr/bin/env bash
# The benchmark's throughput measures through one node on each store: the same release
# build on the embedded SQLite store and on PostgreSQL (a throwaway server started here, as
# in scripts/cluster.sh), in interleaved rounds; the ratio is PostgreSQL / SQLite.
#
#   scripts/bench-store.sh [rounds]     # default 3 rounds
#
# Environment: SCENARIOS (default one-stream,concurrent,ttfe,rss-after), and everything
# scripts/bench.sh reads.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
source "$root/scripts/lib.sh"
trap cleanup EXIT
(cd "$root" && cargo build --release --bin agui-serve)
(cd "$root" && cargo build --release --example loadgen --example bare_sse)
pg_start
# A daemon build on PostgreSQL, with agui-serve's command line (exec: the benchmark's
# process id is the daemon's).
wrapper="$work/agui-serve-postgres"
cat >"$wrapper" <<WRAP
#!/usr/bin/env bash
exec "$root/target/release/agui-serve" "\$@" --store "$AGUI_PG_URL" --node-id bench
WRAP
chmod +x "$wrapper"
SCENARIOS="${SCENARIOS:-one-stream,concurrent,ttfe,rss-after}" \
  "$root/scripts/bench.sh" "$root/target/release/agui-serve" "$wrapper" "$rounds"
