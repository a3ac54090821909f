"""doorman_bench_python: what `RateResource.try_acquire` costs in Python, next to a token bucket
behind one `threading.Lock` (what a hand-written limiter would be), side by side in one run.

    /usr/bin/python3 benchmarks/python_try_acquire.py [--calls N] [--threads 1,4] [--json FILE]
    /usr/bin/python3 benchmarks/python_try_acquire.py --baseline REV [--rounds K] [--json FILE]

With `--baseline`, the client of git revision REV and the working tree's are measured side by
side instead: K rounds, each running this script once per version (alternating which goes
first, so a machine whose speed drifts affects both alike), then per version and thread count
the median and range of ns per call, and the ratio of the medians (new / old).

Each row: ns per call (wall time over all calls of all threads), with 1 and several threads
calling at once. The client holds its capacity from its safe fallback (no server: the address
refuses), so no refresh is on the measured path; the capacity is large, so every call is
admitted and the GCRA arithmetic is done in full.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# --package DIR (the side-by-side runs): the client package measured is DIR's, not the tree's.
_package = sys.argv[sys.argv.index("--package") + 1] if "--package" in sys.argv else None
sys.path.insert(0, _package or os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import doorman  # noqa: E402
from support import free_port_refusing  # noqa: E402


class LockBucket:
    """A token bucket behind one lock: the comparison."""

    def __init__(self, rate: float, burst: float) -> None:
        self.lock = threading.Lock()
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.last = time.monotonic()

    def try_acquire(self, n: float = 1) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= n:
                self.tokens -= n
                return True
            return False


def measure(acquire, calls: int, threads: int) -> float:  # type: ignore[no-untyped-def]
    """ns per call, `calls` in all, split over `threads`."""
    each = calls // threads
    start_line = threading.Barrier(threads + 1)

    def run() -> None:
        start_line.wait()
        for _ in range(each):
            acquire()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    start_line.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    return (time.perf_counter() - t0) * 1e9 / (each * threads)


def side_by_side(a: argparse.Namespace) -> int:
    """The working tree's client against the one of `a.baseline`, in alternating rounds."""
    if a.rounds < 1:
        raise SystemExit("python_try_acquire: --rounds: must be at least 1")
    root = os.path.join(HERE, "..")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", root, "archive", a.baseline, "python/doorman"],
                                 capture_output=True)
        if archive.returncode != 0:
            raise SystemExit(f"python_try_acquire: --baseline {a.baseline}: "
                             f"{archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        packages = {"old": os.path.join(tmp, "python"), "new": os.path.join(root, "python")}
        ns: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds):
            for version in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                out = os.path.join(tmp, "round.json")
                subprocess.run([sys.executable, __file__, "--package", packages[version],
                                "--calls", str(a.calls), "--threads", a.threads, "--json", out],
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    for row in json.load(f)["rows"]:
                        if row["limiter"].startswith("doorman"):
                            ns.setdefault((version, row["threads"]), []).append(row["ns_per_call"])
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)
    rows = []
    print("| version | threads | median ns per call | range |\n|---|---:|---:|---:|")
    for (version, t), xs in sorted(ns.items(), key=lambda kv: (kv[0][1], kv[0][0] == "new")):
        label = a.baseline if version == "old" else "working tree"
        rows.append({"version": label, "threads": t, "median": statistics.median(xs),
                     "min": min(xs), "max": max(xs)})
        print(f"| {label} | {t} | {statistics.median(xs):.0f} | {min(xs):.0f}-{max(xs):.0f} |")
    ratios = {}
    for t in sorted({t for _, t in ns}):
        ratios[t] = statistics.median(ns[("new", t)]) / statistics.median(ns[("old", t)])
        print(f"new / old at {t} thread(s): {ratios[t]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "baseline": a.baseline,
                       "rounds": a.rounds, "rows": rows,
                       "ratio": {str(t): round(r, 3) for t, r in ratios.items()}}, f, indent=1)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--json")
    p.add_argument("--baseline", help="a git revision: its client and the tree's, side by side")
    p.add_argument("--rounds", type=int, default=5, help="with --baseline: rounds per version")
    p.add_argument("--package", help=argparse.SUPPRESS)  # read before the import, above
    a = p.parse_args()
    if a.baseline:
        return side_by_side(a)
    threads = [int(t) for t in a.threads.split(",")]
    client = doorman.Client(free_port_refusing(), log=None)
    api = client.rate("bench", wants=1e9, safe_capacity=1e9, burst=1e9)
    if api.capacity != 1e9:
        print("the fallback capacity did not apply", file=sys.stderr)
        return 1
    bucket = LockBucket(1e9, 1e9)
    rows = []
    for t in threads:
        for name, f in (("doorman RateResource.try_acquire", api.try_acquire),
                        ("threading.Lock token bucket", bucket.try_acquire)):
            ns = measure(f, a.calls, t)
            rows.append({"limiter": name, "threads": t, "ns_per_call": round(ns, 1)})
    client.close()
    print("| limiter | threads | ns per call |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['limiter']} | {r['threads']} | {r['ns_per_call']:.0f} |")
    by = {(r["limiter"], r["threads"]): r["ns_per_call"] for r in rows}
    for t in threads:
        ratio = by[("doorman RateResource.try_acquire", t)] / by[("threading.Lock token bucket", t)]
        print(f"ratio at {t} thread(s): {ratio:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
