#!/usr/bin/env bash
# The short fuzz run for CI: builds every libFuzzer target with the coverage
# instrumentation cargo-fuzz uses (release, debug assertions and overflow checks on) and
# runs each for FUZZ_SECONDS (default 15) from its committed seeds in
# fuzz/corpus/<target>. Exits non-zero if any target crashes, fails an invariant, hangs
# or runs out of memory; the input that did it is in fuzz/artifacts/<target>/ (reproduce:
# docs/fuzzing.md).
#
# It calls cargo itself with cargo-fuzz's flags, so CI needs no cargo-fuzz install, and
# it keeps cargo's parallel codegen units (cargo-fuzz forces one per crate in release
# builds, for ThinLTO's sake: about twice the build time on 2 cores, for a faster fuzzer
# that a 10-second run does not need). No sanitizer by default: the targets are safe
# Rust (AddressSanitizer instruments only Rust code, not SQLite's C), and a panic,
# an abort, a hang or a memory limit is what they look for. FUZZ_SANITIZER=address adds
# it (nightly-only flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them).
#
#   bash fuzz/ci.sh                      # every target, 15 s each, opt-level 1
#   FUZZ_SECONDS=60 bash fuzz/ci.sh merkle checkpoint
#   FUZZ_SANITIZER=address FUZZ_OPT_LEVEL=3 FUZZ_SECONDS=600 bash fuzz/ci.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-15}"
sanitizer="${FUZZ_SANITIZER:-none}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
# opt-level 1 builds far faster than 3 and still runs thousands of inputs a second;
# fuzz/Cargo.toml keeps the crypto, hashing and compression at 3. FUZZ_OPT_LEVEL=3 for
# long runs.
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${FUZZ_OPT_LEVEL:-1}"
export CARGO_PROFILE_RELEASE_DEBUG="line-tables-only"

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^countersign-fuzz$')
fi

# cargo-fuzz's instrumentation (src/project.rs of cargo-fuzz 0.13): libFuzzer's
# coverage counters and comparison tracing, cfg(fuzzing), no branch folding.
flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cllvm-args=-simplifycfg-branch-fold-threshold=0
    -Cllvm-args=-sanitizer-coverage-stack-depth
    --cfg fuzzing
    -Cdebug-assertions
    -Coverflow-checks=on
)
case "$sanitizer" in
    none) ;;
    address)
        export RUSTC_BOOTSTRAP=1
        export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"
        flags+=(-Zsanitizer=address)
        ;;
    *) echo "fuzz: FUZZ_SANITIZER is none or address, not $sanitizer" >&2; exit 2 ;;
esac
[ -z "${FUZZ_CODEGEN_UNITS:-}" ] || flags+=("-Ccodegen-units=$FUZZ_CODEGEN_UNITS")

start=$(date +%s)
bins=()
for target in "${targets[@]}"; do bins+=(--bin "$target"); done
# --target keeps these flags off build scripts and proc macros, as cargo-fuzz does.
RUSTFLAGS="${flags[*]} ${RUSTFLAGS:-}" cargo build --manifest-path fuzz/Cargo.toml \
    --release --target "$triple" "${bins[@]}"
echo "fuzz: built ${#targets[@]} targets in $(( $(date +%s) - start ))s (sanitizer: $sanitizer)"

# What the run adds to the corpus is thrown away; only the seeds are committed.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=()
for target in "${targets[@]}"; do
    mkdir -p "$work/$target" "fuzz/artifacts/$target"
    dict=()
    case "$target" in
        proof_verify | log_entry | action_digest | server_*) dict=(-dict=fuzz/json.dict) ;;
    esac
    echo "fuzz: $target for ${seconds}s"
    log="$work/$target.log"
    # -timeout: one input taking longer than this is a hang (a failure).
    if "fuzz/target/$triple/release/$target" "$work/$target" "fuzz/corpus/$target" \
        -artifact_prefix="fuzz/artifacts/$target/" \
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
