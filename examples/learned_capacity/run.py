"""The worked example of docs/learned-capacity.md, with real processes: a backend (backend.py)
answers 429 above a capacity it changes at run time; three callers (caller.py) call it through
their doorman rate handles, two under an intermediate and one at the root, which learns the
backend's capacity from their answers. The backend's capacity steps -50 % at 20 s and +50 % at
45 s. At 60 s the master changes: the one root task is stopped and started again; with --etcd
the root is two tasks electing a master through a real etcd (/usr/bin/etcd, Debian's
etcd-server), and the master is killed (SIGKILL), so the other takes over. Either way the new
master starts from what the clients hold, once its learning mode is over.
Every 5 s a line: the backend's capacity, the master's, and what the backend served and refused
a second. At the end, a verdict:

- overloaded: at most 5 % of all calls, and at most 15 % of those in the 15 s after -50 %;
- used: at least 60 % of the capacity served over each steady span (the 5 s before a change,
  and the last 10 s: after a step up, and after the master change at 60 s, the law's probes
  take their time to find the room again; runs have measured 65.7-70.3 %);
- learned: the master's capacity within 30 % of the backend's at the end (its mean over the
  last 10 s: one overload's cut in the last seconds is the law at work, not a miss).

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
CHANGE = 60.0  # the master changes then
ETCD = "/usr/bin/etcd"
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


def master_status(cli: str, address: str) -> dict[str, Any] | None:
    """`doorman status --json` of the task at `address` when it answers as master, else None."""
    out = subprocess.run([cli, "status", "--server", address, "--json"], capture_output=True,
                         text=True)
    try:
        status = json.loads(out.stdout)
    except ValueError:
        return None
    if not isinstance(status, dict) or not status.get("mastership", {}).get("is_master"):
        return None
    return status


def learned(cli: str, roots: list[str]) -> float:
    """The master's capacity for `backend` (`master_status` of each root task), or -1 when no
    task answers as master."""
    for root in roots:
        status = master_status(cli, root)
        if status is None:
            continue
        for r in status.get("resources", []):
            if r.get("resource_id") == "backend":
                return float(r.get("capacity", -1))
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
    p.add_argument("--etcd", action="store_true",
                   help="two root tasks electing a master through etcd (/usr/bin/etcd), the "
                        "master killed at 60 s; else one root task, stopped and started again")
    a = p.parse_args()
    if a.etcd and not os.access(ETCD, os.X_OK):
        p.error(f"--etcd: no {ETCD} (Debian's etcd-server)")
    node, cli, env, logs = prepare(p, a.bin, "doorman-learned-capacity-", config())
    children: list[Process] = []
    try:
        return run(node, cli, env, logs, children, not a.etcd)
    finally:
        for c in reversed(children):
            c.stop()
        print(f"logs in {logs}")


def start_roots(node: str, logs: str, children: list[Process], restart: bool) -> list[Process]:
    """The root position: one task (`restart`), or two electing a master through a new etcd."""
    argv = [node, "--admin", "off", "--config", os.path.join(logs, "resources.json")]
    if restart:
        root = Process("root", [*argv, "--listen", free_address()], logs)
        children.append(root)
        return [root]
    client, peer = free_address(), "http://" + free_address()
    etcd = Process("etcd", [ETCD, "--name", "learned", "--data-dir", os.path.join(logs, "etcd"),
                            "--listen-client-urls", "http://" + client,
                            "--advertise-client-urls", "http://" + client,
                            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                            "--initial-cluster", "learned=" + peer],
                   logs, ready="ready to serve client requests")
    children.append(etcd)
    roots = []
    for name in ("root-a", "root-b"):
        roots.append(Process(name, [*argv, "--listen", free_address(), "--id", name,
                                    "--etcd-endpoints", client, "--election-key",
                                    "/doorman-learned/root", "--election-ttl", "2"], logs))
        children.append(roots[-1])
    return roots


def change_master(node: str, logs: str, children: list[Process], roots: list[Process],
                  cli: str) -> str:
    """The master's end: the one root task stopped and started again on its address, or the
    elected one killed (the other task takes over; `roots` keeps the live ones). What
    happened, for the output."""
    if len(roots) == 1:
        roots[0].stop()
        argv = list(roots[0].proc.args)  # the same address
        roots[0] = Process("root-2", argv, logs)
        children.append(roots[0])
        return "root stopped and started again"
    for i, r in enumerate(roots):
        if master_status(cli, r.address) is not None:
            r.proc.kill()
            roots.pop(i)  # asked no more (a dead address costs the CLI its timeout)
            return f"master {r.name} killed; {roots[0].name} takes over"
    return "no master to kill"


def run(node: str, cli: str, env: dict[str, str], logs: str, children: list[Process],
        restart: bool) -> int:
    py = sys.executable
    roots = start_roots(node, logs, children, restart)
    addresses = ",".join(r.address for r in roots)
    mid = Process("intermediate", [node, "--listen", "127.0.0.1:0", "--admin", "off", "--parent",
                                   addresses, "--id", "mid"], logs)
    children.append(mid)
    backend = Process("backend", [py, os.path.join(HERE, "backend.py"), "--capacity",
                                  str(CAPACITY)], logs, env)
    children.append(backend)
    callers = []
    for i, at in enumerate([mid.address, mid.address, addresses]):
        c = Process(f"caller-{i + 1}", [py, os.path.join(HERE, "caller.py"), "--doorman", at,
                                        "--backend", "http://" + backend.address, "--wants", "200",
                                        "--name", f"caller-{i + 1}"], logs, env)
        children.append(c)
        callers.append(c)
    print(f"root {addresses}{' (two tasks under etcd)' if len(roots) > 1 else ''}, intermediate "
          f"{mid.address} (callers 1 and 2), backend {backend.address}; the root learns "
          f"'backend' from {CAPACITY:g}")
    print("   t  backend  learned  served/s  429/s")
    began, wall = time.monotonic(), time.time()
    steps = list(STEPS)
    changed = False
    history: list[tuple[float, float, float]] = []  # (t, backend's capacity, learned)
    for tick in range(1, int(DURATION) + 1):
        time.sleep(max(0.0, began + tick - time.monotonic()))
        if steps and tick >= steps[0][0]:
            post_capacity(backend.address, steps.pop(0)[1])
        if not changed and tick >= CHANGE:
            print(f"{tick:4d}s  {change_master(node, logs, children, roots, cli)}", flush=True)
            changed = True
        history.append((tick, current(tick), learned(cli, [r.address for r in roots])))
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
    end = [x for x in history if x[0] > DURATION - 10]
    error = abs(sum(l - c for _, c, l in end) / sum(c for _, c, _ in end)) if end else 1.0
    checks = [
        (over <= 0.05 * calls, f"overloaded: {over:.0f} of {calls:.0f} calls "
                               f"({100 * over / max(calls, 1):.1f} %, at most 5 %)"),
        (step_over <= 0.15 * step_calls, f"in the 15 s after -50 %: {step_over:.0f} of "
                                          f"{step_calls:.0f} ({100 * step_over / max(step_calls, 1):.1f} %, at most 15 %)"),
        (used >= 0.6, f"used over the steady spans: at least {100 * used:.1f} % (at least 60 %)"),
        (error <= 0.3, f"learned at the end, after the master changed: within {100 * error:.1f} % "
                       "of the backend's over the last 10 s (at most 30 %)"),
    ]
    for ok, line in checks:
        print(("ok    " if ok else "FAIL  ") + line)
    good = all(ok for ok, _ in checks)
    print(f"the learned capacity held: {'yes' if good else 'NO'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
