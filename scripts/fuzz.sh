#!/usr/bin/env bash
# Fuzzes every cargo-fuzz target in fuzz/ for SECONDS each (default 60), starting from the
# committed corpora in fuzz/corpus/<target> and the hand-written seeds in fuzz/seeds/<target>
# (read only), then minimizes each corpus (cargo fuzz cmin) so what is committed stays small. Not part of scripts/test.sh. Needs the nightly toolchain;
# installs cargo-fuzz when it is missing. A crash stops nothing: every target runs, then the
# script lists the crashing inputs (fuzz/artifacts/<target>/) and exits 1. Turn each one
# into a regression test before fixing it.
# Usage: scripts/fuzz.sh [SECONDS-PER-TARGET] [TARGET...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true

rustup toolchain list 2>/dev/null | grep -q '^nightly' \
  || { echo "fuzz.sh: needs the nightly toolchain: rustup toolchain install nightly" >&2; exit 1; }
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz </dev/null

cd "$root/fuzz"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build

failed=()
for target in "${targets[@]}"; do
  echo "== $target: ${seconds}s"
  mkdir -p "corpus/$target" "seeds/$target"
  if ! cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1; then
    failed+=("$target")
    continue
  fi
  cargo +nightly fuzz cmin "$target" "corpus/$target" >/dev/null 2>&1 \
    || echo "fuzz.sh: minimizing corpus/$target failed; left as it is" >&2
  echo "   corpus/$target: $(find "corpus/$target" -type f | wc -l) inputs"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: crashes in: ${failed[*]}" >&2
  for target in "${failed[@]}"; do ls "artifacts/$target" >&2 || true; done
  exit 1
fi
echo "fuzz.sh: no crash in ${#targets[@]} targets, ${seconds}s each"
