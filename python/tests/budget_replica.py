"""One replica of a service spending a shared budget, for test_client's real-process budget
test: it reserves the most a call can cost, "calls" (2 ms), and settles the call's real cost
(heavy-tailed, 100 to 3000 units). Each reservation and settlement is logged before and after
the call, so that a replica killed in the middle of a call leaves what it may have spent.

    budget_replica.py ADDRESSES LOG SEED [WANTS]

WANTS: the units it asks to hold (default: measured from use).
"""

from __future__ import annotations

import os
import random
import sys
import time

import doorman

MOST = 3000  # the most a call costs: reserved in full, so that no settlement runs into debt


def main() -> None:
    addresses, log_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = {"wants": float(sys.argv[4])} if len(sys.argv) > 4 else {}
    rng = random.Random(seed)
    with doorman.Client(addresses, minimum_refresh_interval=0.1, sample_interval=0.2,
                        demand_window=1.0, call_timeout=1) as c:
        tokens = c.budget("tokens", **options)
        with open(log_path, "a", buffering=1) as log:
            while not os.path.exists(log_path + ".stop"):
                try:
                    tokens.wait(MOST, timeout=0.2)
                except TimeoutError:
                    continue
                log.write(f"reserve {MOST}\n")
                time.sleep(0.002)  # the call
                used = min(MOST, int(100 * rng.paretovariate(1.5)))
                tokens.settle(MOST, used)
                log.write(f"settle {used}\n")


if __name__ == "__main__":
    main()
