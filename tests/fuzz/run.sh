#!/usr/bin/env sh
# Runs every libFuzzer target for SECONDS each (default 60), one after the other, on the seed
# corpus in tests/fuzz/corpus/<target> plus a work corpus in build/fuzz/work/<target>
# ($FUZZ_WORK; new inputs go there, the repository's seeds are only read). Stops at the first target that finds
# something: its input is saved as build/fuzz/crash-... and the script exits non-zero.
# Usage: tests/fuzz/run.sh [SECONDS] [TARGET...]   (from the repository root, after building
# the `fuzz` preset; `make fuzz` does both)
set -eu
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-dispatch engine config answers http admin access rules cli yaml}
bin=${FUZZ_BIN:-build/fuzz/tests/fuzz}    # where the targets are
work=${FUZZ_WORK:-build/fuzz/work}        # where each target's new inputs and log go
for t in $targets; do
  mkdir -p "$work/$t"
  log="$work/$t.log"
  printf 'fuzz %-9s %4s s ... ' "$t" "$seconds"
  if ! "$bin/doorman_fuzz_$t" "$work/$t" "tests/fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix=build/fuzz/ >"$log" 2>&1; then
    echo "FOUND A PROBLEM"
    grep -E 'invariant broken|ERROR|SUMMARY|Test unit written' "$log" >&2 || tail -30 "$log" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "ok: $runs executions, $speed/s"
done
