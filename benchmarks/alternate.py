#!/usr/bin/python3
"""Runs two or more builds of a Google Benchmark program in turn, round after round, and prints
the median (and range) of each benchmark for each build.

On a shared VM the speed of memory moves by 10-20% from minute to minute. Running the builds
alternately spreads that drift over all of them alike, so their medians can be compared where
two separate runs could not.

    /usr/bin/python3 benchmarks/alternate.py --rounds 6 \
        --filter '^(fair_share|share_index_update)/' \
        before=/tmp/doorman-base/build/release/benchmarks/doorman_bench_decision \
        after=build/release/benchmarks/doorman_bench_decision
"""

import argparse
import csv
import io
import statistics
import subprocess
import sys


def parse_build(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"a build is NAME=PATH, got {text!r}")
    return name, path


def run_once(path, bench_filter):
    """One run of one build: {benchmark name: real time per iteration}."""
    out = subprocess.run(
        [path, f"--benchmark_filter={bench_filter}", "--benchmark_format=csv"],
        check=True, capture_output=True, text=True).stdout
    # Google Benchmark prints a header line starting with "name," before the rows.
    start = out.find("name,")
    if start < 0:
        raise RuntimeError(f"{path}: no CSV in its output (does the filter match anything?)")
    times = {}
    for row in csv.DictReader(io.StringIO(out[start:])):
        if row.get("error_occurred") == "true":
            raise RuntimeError(f"{path}: {row['name']} failed: {row.get('error_message')}")
        name = row["name"].split("/min_time")[0]
        times[f"{name} ({row['time_unit']})"] = float(row["real_time"])
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6, help="runs of each build (default 6)")
    p.add_argument("--filter", default=".", help="--benchmark_filter for every run")
    p.add_argument("builds", nargs="+", type=parse_build, help="NAME=PATH of a benchmark binary")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    results = {}  # (benchmark, build) -> [times]
    order = []
    for r in range(args.rounds):
        for name, path in args.builds:
            print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            try:
                times = run_once(path, args.filter)
            except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
                sys.exit(f"alternate.py: error: {e}")
            for bench, t in times.items():
                if bench not in order:
                    order.append(bench)
                results.setdefault((bench, name), []).append(t)
    names = [n for n, _ in args.builds]
    print("| benchmark | " + " | ".join(f"{n} median (range)" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for bench in order:
        cells = []
        for n in names:
            ts = results.get((bench, n), [])
            cells.append(f"{statistics.median(ts):,.0f} ({min(ts):,.0f}–{max(ts):,.0f})"
                         if ts else "—")
        print(f"| {bench} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
