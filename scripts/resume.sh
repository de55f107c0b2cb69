#!/usr/bin/env bash
# The resumable client (clients/resume): builds it with tsc, packs it with npm pack, then
# drives it with each official client (@ag-ui/client 1.0.0 and 0.0.59) against agui-serve
# through a proxy that cuts streams mid-run. Usage: scripts/resume.sh [BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/agui-serve}"
[ -x "$bin" ] || { echo "resume: no binary at $bin (cargo build first)" >&2; exit 1; }

source "$root/scripts/lib.sh"
cd "$root/clients/resume"
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
# The package holds the built module and its types, nothing else of the tree.
npm pack --silent --pack-destination "$work" >/dev/null
tar -tzf "$work"/agui-serve-resume-*.tgz | sort >"$work/packed"
for file in package/package.json package/README.md package/dist/index.js package/dist/index.d.ts \
  package/dist/transport.js package/dist/transport.d.ts; do
  grep -qx "$file" "$work/packed" || { echo "resume: $file is not in the package:" >&2; cat "$work/packed" >&2; exit 1; }
done
if grep -v '^package/\(package\.json\|README\.md\|dist/.*\)$' "$work/packed"; then
  echo "resume: the package holds more than its build" >&2
  exit 1
fi
echo "ok   [resume] npm pack: $(wc -l <"$work/packed") files, the build and the README"

# Plain HTTP on loopback, so the proxy cuts at exact byte counts; a long disconnect grace,
# so a finished run's frames are still journaled when the test reads them back.
token="resume-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
start_daemon --no-tls --token "$token" --disconnect-grace 10m
# Both clients run, whatever the first one's result.
status=0
for client in 1.0.0 0.0.59; do
  AGUI_URL="$daemon" AGUI_TOKEN="$token" AGUI_CLIENT="$client" \
    node --import ./test/client.mjs test/resume.mjs || status=1
done
exit "$status"
