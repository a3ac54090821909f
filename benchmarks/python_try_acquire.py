"""doorman_bench_python: what `RateResource.try_acquire` costs in Python, next to a token bucket
behind one `threading.Lock` (what a hand-written limiter would be), side by side in one run.

    /usr/bin/python3 benchmarks/python_try_acquire.py [--calls N] [--threads 1,4] [--json FILE]

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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--json")
    a = p.parse_args()
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
