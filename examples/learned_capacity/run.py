"""The worked example of docs/learned-capacity.md, with real processes: a backend (backend.py)
answers 429 above a capacity it changes at run time; three callers (caller.py) call it through
their doorman rate handles, two under an intermediate and one at the root, which learns the
backend's capacity from their answers. The backend's capacity steps -50 % at 20 s and +50 % at
45 s; at 60 s the root is stopped and started again (a master change: the new one starts from
what the clients hold, once its learning mode is over). Every 5 s a line: the backend's
capacity, the root's, and what the backend served and refused a second. At the end, a verdict:

- overloaded: at most 5 % of all calls, and at most 15 % of those in the 15 s after -50 %;
- used: at least 70 % of the capacity served over each steady span (the 5 s before a change,
  and the last 10 s);
- learned: the root's capacity within 30 % of the backend's at the end.

    /usr/bin/python3 examples/learned_capacity/run.py --bin build/dev/examples

`--bin` holds doorman-node and doorman. Exit status 0 when every check held. The standard
library and the doorman Python package only (python/ of this repository when not installed)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from children import Process, prepare  # noqa: E402  (examples/children.py)

CAPACITY = 300.0  # the backend's at first, calls a second
STEPS = [(20.0, 150.0), (45.0, 225.0)]  # (seconds, capacity): -50 %, then +50 %
RESTART = 60.0  # the root is stopped and started again then
DURATION = 80.0


def config() -> dict[str, Any]:
    return {"resources": [
        {"identifier_glob": "backend", "capacity": CAPACITY, "learn": {"min": 20, "max": 3000},
         "algorithm": {"kind": "FAIR_SHARE", "lease_length": 10, "refresh_interval": 2,
                       "learning_mode_duration": 6},
         "description": "calls a second to the backend, learned from its answers"},
        {"identifier_glob": "*", "capacity": 0,
         "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]}


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def learned(cli: str, root: str) -> float:
    """The root's capacity for `backend` (`doorman status --json`), or -1 when it answers none."""
    out = subprocess.run([cli, "status", "--server", root, "--json"], capture_output=True, text=True)
    try:
        for r in json.loads(out.stdout).get("resources", []):
            if r.get("resource_id") == "backend":
                return float(r.get("capacity", -1))
    except ValueError:
        pass
    return -1.0


def post_capacity(backend: str, capacity: float) -> None:
    req = urllib.request.Request(f"http://{backend}/capacity", method="POST",
                                 data=json.dumps({"capacity": capacity}).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def seconds(backend: str) -> list[list[float]]:
    with urllib.request.urlopen(f"http://{backend}/seconds", timeout=5) as r:
        return list(json.load(r))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="the folder of doorman-node and doorman")
    a = p.parse_args()
    node, cli, env, logs = prepare(p, a.bin, "doorman-learned-capacity-", config())
    children: list[Process] = []
    try:
        return run(node, cli, env, logs, children)
    finally:
        for c in reversed(children):
            c.stop()
        print(f"logs in {logs}")


def run(node: str, cli: str, env: dict[str, str], logs: str, children: list[Process]) -> int:
    py = sys.executable
    address = free_address()  # the root's, kept across its restart
    root_argv = [node, "--listen", address, "--admin", "off", "--config",
                 os.path.join(logs, "resources.json")]
    root = Process("root", root_argv, logs)
    children.append(root)
    mid = Process("intermediate", [node, "--listen", "127.0.0.1:0", "--admin", "off", "--parent",
                                   address, "--id", "mid"], logs)
    children.append(mid)
    backend = Process("backend", [py, os.path.join(HERE, "backend.py"), "--capacity",
                                  str(CAPACITY)], logs, env)
    children.append(backend)
    callers = []
    for i, at in enumerate([mid.address, mid.address, address]):
        c = Process(f"caller-{i + 1}", [py, os.path.join(HERE, "caller.py"), "--doorman", at,
                                        "--backend", "http://" + backend.address, "--wants", "200",
                                        "--name", f"caller-{i + 1}"], logs, env)
        children.append(c)
        callers.append(c)
    print(f"root {address}, intermediate {mid.address} (callers 1 and 2), backend {backend.address};"
          f" the root learns 'backend' from {CAPACITY:g}")
    print("   t  backend  learned  served/s  429/s")
    began, wall = time.monotonic(), time.time()
    steps = list(STEPS)
    restarted = False
    history: list[tuple[float, float, float]] = []  # (t, backend's capacity, learned)
    for tick in range(1, int(DURATION) + 1):
        time.sleep(max(0.0, began + tick - time.monotonic()))
        if steps and tick >= steps[0][0]:
            post_capacity(backend.address, steps.pop(0)[1])
        if not restarted and tick >= RESTART:
            root.stop()
            root = Process("root-2", root_argv, logs)  # the same address
            children.append(root)
            restarted = True
        history.append((tick, current(tick), learned(cli, address)))
        if tick % 5 == 0:
            recent = [s for s in seconds(backend.address) if s[0] >= wall + tick - 5]
            served = sum(s[2] for s in recent) / 5
            refused = sum(s[3] for s in recent) / 5
            print(f"{tick:4d}s  {current(tick):7.0f}  {history[-1][2]:7.1f}  {served:8.1f}  "
                  f"{refused:5.1f}", flush=True)
    for c in callers:
        c.stop()
        print(c.log().strip().splitlines()[-1])
    return verdict(seconds(backend.address), wall, history)


def current(t: float) -> float:
    """The backend's capacity at `t` seconds into the run."""
    c = CAPACITY
    for at, value in STEPS:
        if t >= at:
            c = value
    return c


def verdict(record: list[list[float]], wall: float, history: list[tuple[float, float, float]]) -> int:
    def span(a: float, b: float) -> tuple[float, float, float]:
        rows = [s for s in record if wall + a <= s[0] < wall + b]
        return (sum(s[2] + s[3] for s in rows), sum(s[3] for s in rows),
                sum(s[2] for s in rows) / max(1e-9, sum(current(s[0] - wall) for s in rows)))
    calls, over, _ = span(5, DURATION)
    _, step_over, _ = span(STEPS[0][0], STEPS[0][0] + 15)
    step_calls, _, _ = span(STEPS[0][0], STEPS[0][0] + 15)
    used = min(span(STEPS[0][0] - 5, STEPS[0][0])[2], span(STEPS[1][0] - 5, STEPS[1][0])[2],
               span(DURATION - 10, DURATION)[2])
    end = [x for x in history if x[0] >= DURATION - 3]
    error = max(abs(l - c) / c for _, c, l in end) if end else 1.0
    checks = [
        (over <= 0.05 * calls, f"overloaded: {over:.0f} of {calls:.0f} calls "
                               f"({100 * over / max(calls, 1):.1f} %, at most 5 %)"),
        (step_over <= 0.15 * step_calls, f"in the 15 s after -50 %: {step_over:.0f} of "
                                          f"{step_calls:.0f} ({100 * step_over / max(step_calls, 1):.1f} %, at most 15 %)"),
        (used >= 0.7, f"used over the steady spans: at least {100 * used:.1f} % (at least 70 %)"),
        (error <= 0.3, f"learned at the end, after the root's restart: within {100 * error:.1f} % "
                       "of the backend's (at most 30 %)"),
    ]
    for ok, line in checks:
        print(("ok    " if ok else "FAIL  ") + line)
    good = all(ok for ok, _ in checks)
    print(f"the learned capacity held: {'yes' if good else 'NO'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
