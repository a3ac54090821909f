"""One replica of a service making calls of heavy-tailed cost, for test_client's real-process
tests. Each reservation and settlement is logged before and after the call (with the time it
was admitted, on the monotonic clock all processes share), so that a replica killed in the
middle of a call leaves what it may have spent.

    replica.py budget ADDRESSES LOG SEED [WANTS]
    replica.py rate ADDRESSES LOG SEED

budget: spends the budget "tokens": reserves the most a call can cost (3 000), "calls" (2 ms)
and settles the call's real cost (100 to 3 000 units); WANTS: the units it asks to hold
(default: measured from use).
rate: calls through the rate resource "api": reserves an estimate (1 000) before each call,
"calls" (5 ms) and settles the call's real cost (100 to 30 000 units, a heavier tail), running
into debt when it costs more than the estimate.
"""

from __future__ import annotations

import os
import random
import sys
import time

import doorman


def main() -> None:
    kind, addresses, log_path, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = {"wants": float(sys.argv[5])} if len(sys.argv) > 5 else {}
    rng = random.Random(seed)
    if kind == "budget":
        reserve, latency, most, shape = 3000, 0.002, 3000, 1.5
    else:
        reserve, latency, most, shape = 1000, 0.005, 30000, 1.1
    with doorman.Client(addresses, minimum_refresh_interval=0.1, sample_interval=0.2,
                        demand_window=1.0, call_timeout=1) as c:
        units = c.budget("tokens", **options) if kind == "budget" else c.rate("api", **options)
        with open(log_path, "a", buffering=1) as log:
            while not os.path.exists(log_path + ".stop"):
                window = units.window if kind == "budget" else None
                try:
                    slot = units.wait(reserve, timeout=0.2)  # a rate's call's place, for settle
                except TimeoutError:
                    continue
                log.write(f"reserve {reserve} {time.monotonic():.6f}\n")
                time.sleep(latency)  # the call
                used = min(most, int(100 * rng.paretovariate(shape)))
                if window is None:
                    units.settle(reserve, used, slot)
                else:  # a budget's, in the window the call was admitted in
                    units.settle(reserve, used, window)
                log.write(f"settle {used}\n")


if __name__ == "__main__":
    main()
