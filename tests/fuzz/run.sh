#!/usr/bin/env sh
# Runs every libFuzzer target for SECONDS each (default 60), FUZZ_JOBS at a time (default 2, one
# per core of the CI machine), on the seed corpus in tests/fuzz/corpus/<target> plus a work
# corpus in build/fuzz/work/<target> ($FUZZ_WORK; new inputs go there, the repository's seeds
# are only read). A target that finds something leaves its input as build/fuzz/crash-..., the
# lines of its log that say what, and the script exits non-zero once the running ones end.
# Usage: tests/fuzz/run.sh [SECONDS] [TARGET...]   (from the repository root, after building
# the `fuzz` preset; `make fuzz` does both)
set -eu
seconds=${1:-60}
[ $# -gt 0 ] && shift
bin=${FUZZ_BIN:-build/fuzz/tests/fuzz}    # where the targets are
# grpc, rlqs: when the gRPC layer was found (Doorman's gRPC messages, and Envoy's quota reports,
# through their mappings).
all="dispatch engine config answers http admin access rules cli limits yaml"
[ -x "$bin/doorman_fuzz_grpc" ] && all="$all grpc"
[ -x "$bin/doorman_fuzz_rlqs" ] && all="$all rlqs"
targets=${*:-$all}
work=${FUZZ_WORK:-build/fuzz/work}        # where each target's new inputs and log go
jobs=${FUZZ_JOBS:-2}

# One target: its verdict line on stdout (printed whole, so parallel runs do not interleave).
run_one() {
  t=$1
  mkdir -p "$work/$t"
  log="$work/$t.log"
  if ! "$bin/doorman_fuzz_$t" "$work/$t" "tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix=build/fuzz/ >"$log" 2>&1; then
    printf 'fuzz %-9s %4s s ... FOUND A PROBLEM\n' "$t" "$seconds"
    grep -E 'invariant broken|ERROR|SUMMARY|Test unit written' "$log" >&2 || tail -30 "$log" >&2
    return 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  printf 'fuzz %-9s %4s s ... ok: %s executions, %s/s\n' "$t" "$seconds" "$runs" "$speed"
}

# Batches of $jobs targets; every target of a batch runs to its end, the first failure stops
# the next batches.
failed=0
set -- $targets
while [ $# -gt 0 ]; do
  pids=""
  i=0
  while [ $# -gt 0 ] && [ "$i" -lt "$jobs" ]; do
    run_one "$1" &
    pids="$pids $!"
    shift
    i=$((i + 1))
  done
  for p in $pids; do
    wait "$p" || failed=1
  done
  [ "$failed" = 0 ] || exit 1
done
