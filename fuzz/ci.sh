#!/usr/bin/env bash
# The short fuzz run for CI: builds every cargo-fuzz target (release, debug assertions
# and overflow checks on, AddressSanitizer) and runs each for FUZZ_SECONDS (default 15)
# from its committed seeds in fuzz/corpus/<target>. Exits non-zero if any target
# crashes, fails an invariant, hangs or runs out of memory; the input that did it is in
# fuzz/artifacts/<target>/ (reproduce: docs/fuzzing.md).
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). cargo-fuzz passes nightly-only
# flags to rustc (-Zsanitizer, sanitizer coverage); RUSTC_BOOTSTRAP=1 lets the stable
# toolchain accept them.
#
#   bash fuzz/ci.sh                      # every target, 15 s each, opt-level 1
#   FUZZ_SECONDS=60 bash fuzz/ci.sh merkle checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
seconds="${FUZZ_SECONDS:-15}"
# opt-level 1 builds in two thirds of the time of 3 (10.9 against 16.5 min on the 2-core
# machine) and still runs thousands of inputs a second; fuzz/Cargo.toml keeps the
# crypto, hashing and compression at 3. FUZZ_OPT_LEVEL=3 for long runs.
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${FUZZ_OPT_LEVEL:-1}"

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

start=$(date +%s)
cargo fuzz build
echo "fuzz: built ${#targets[@]} targets in $(( $(date +%s) - start ))s"

# What the run adds to the corpus is thrown away; only the seeds are committed.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=()
for target in "${targets[@]}"; do
    mkdir -p "$work/$target"
    dict=()
    case "$target" in
        proof_verify | log_entry | action_digest | server_*) dict=(-dict=fuzz/json.dict) ;;
    esac
    echo "fuzz: $target for ${seconds}s"
    log="$work/$target.log"
    # -timeout: one input taking longer than this is a hang (a failure).
    if cargo fuzz run "$target" "$work/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
        -print_final_stats=1 "${dict[@]}" >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
        rate=$(grep -o 'exec/s: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || echo "?")
        echo "fuzz: $target ok: $runs runs, ${rate} exec/s"
    else
        echo "fuzz: $target FAILED; the end of its log:"
        tail -n 60 "$log"
        failed+=("$target")
    fi
done

total=$(( $(date +%s) - start ))
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed (${failed[*]}) in ${total}s; inputs in fuzz/artifacts/"
    exit 1
fi
echo "fuzz: the run took ${total}s"
echo "fuzz: ${#targets[@]} passed, 0 failed"
