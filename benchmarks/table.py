#!/usr/bin/env python3
"""Turns doorman_bench_decision's JSON output into the Markdown table of benchmarks/README.md.

    python3 benchmarks/table.py build/release/decision.json

Uses the median of the repetitions when there are several; the ratio column divides each
cost by the same algorithm's cost at 1 000 clients, all from the one run.
"""
import json
import re
import sys


def main(path: str) -> None:
    with open(path) as f:
        doc = json.load(f)
    cost = {}  # (name, clients) -> ns
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        m = re.match(r"(\w+)/(\d+)", b["name"])
        if not m:
            continue
        unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        cost[(m.group(1), int(m.group(2)))] = b["real_time"] * unit
    ctx = doc.get("context", {})
    print(f"{ctx.get('date', '')}, {ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz,"
          f" build {ctx.get('library_build_type', '?')}\n")
    print("| clients | FAIR_SHARE ns | ratio to 10^3 | PROPORTIONAL_SHARE ns | ratio to 10^3 |"
          " scan (O(n)) ns |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sorted({k[1] for k in cost}):
        row = [f"{n:,}"]
        for name in ("fair_share", "proportional_share"):
            c = cost.get((name, n))
            base = cost.get((name, 1000))
            row.append(f"{c:,.0f}" if c else "")
            row.append(f"{c / base:.2f}x" if c and base else "")
        s = cost.get(("fair_share_scan", n))
        row.append(f"{s:,.0f}" if s else "not run")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/release/decision.json")
