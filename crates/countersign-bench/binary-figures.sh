#!/usr/bin/env bash
# The shipped binary's figures (docs/benchmarks.md, "The shipped binary"): size, the
# time of `countersign --version`, and start-up to a healthy /healthz, for each binary
# given (e.g. target/release/countersign target/dist/countersign).
#
#   crates/countersign-bench/binary-figures.sh target/release/countersign target/dist/countersign
#
# Start-up is countersign-bench's own `startup` (20 runs, a fresh and an existing data
# directory); it is looked for next to the first binary.
set -euo pipefail
bench="$(dirname "$1")/countersign-bench"
for bin in "$@"; do
  echo "== $bin"
  echo "size: $(stat -c %s "$bin") bytes"
  python3 - "$bin" <<'PY'
import statistics, subprocess, sys, time
runs = []
for _ in range(20):
    start = time.perf_counter()
    subprocess.run([sys.argv[1], "--version"], check=True, capture_output=True)
    runs.append((time.perf_counter() - start) * 1000)
print(f"--version, 20 runs (ms): p50 {statistics.median(runs):.2f}, max {max(runs):.2f}")
PY
  "$bench" startup --runs 20 --bin "$bin"
done
