"""The worked example of docs/budgets.md: three replicas of a gateway (gateway.py) in front of
a stand-in model API (model.py), held together to a rate of tokens (any minute at most
`--rate` × 60) and a budget of tokens per UTC day (`--budget`), through a doorman tree of a
root and an intermediate. Clients send the replicas uneven streams of requests, well over what
either limit allows. Every 10 s it prints what the model served through each replica, the
refusals, and the day's budget as the root counts it; at the end the root's budgets as
`doorman status` shows them, and a verdict:

- every 60 s (sliding, from each served call) holds at most the rate × 60, plus each
  replica's burst and one reservation (the largest) per replica;
- no UTC day's tokens pass the budget, and once the budget has held requests back (the last
  10 s served under a fifth of the rate), at least 95 % of it was spent.

    /usr/bin/python3 examples/model_gateway/run.py --bin build/dev/examples [--duration 80]
        [--rate 2000] [--budget 120000] [--seed 1]

`--bin` holds doorman-node and doorman. Exit status 0 when every limit held. The standard
library and the doorman Python package only (python/ of this repository when not installed)."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from children import Process, prepare  # noqa: E402  (examples/children.py)

ARRIVALS = [50.0, 30.0, 20.0]  # requests a second sent to each replica: uneven, all over a share
MAX_TOKENS = [256, 512, 1024, 2048]
PROMPT = (100, 2000)  # a prompt's characters, least and most


def budget_of(cli: str, root: str) -> dict[str, Any]:
    """The day's budget as the root counts it, from `doorman status --json` ({} before its
    first client, or when the CLI fails)."""
    out = subprocess.run([cli, "status", "--server", root, "--json"], capture_output=True, text=True)
    try:
        resources = json.loads(out.stdout).get("resources", [])
    except ValueError:
        return {}
    for r in resources:
        if r.get("resource_id") == "tokens-per-day":
            return dict(r.get("budget") or {})
    return {}


def config(rate: float, budget: float) -> dict[str, Any]:
    algorithm = {"kind": "FAIR_SHARE", "lease_length": 10, "refresh_interval": 1,
                 "learning_mode_duration": 0}
    return {"resources": [
        {"identifier_glob": "tokens-per-minute", "capacity": rate, "algorithm": algorithm,
         "description": "model tokens a second, for the fleet"},
        {"identifier_glob": "tokens-per-day", "capacity": budget, "budget": {"window": "day"},
         "algorithm": algorithm, "description": "model tokens a UTC day, for the fleet"},
        {"identifier_glob": "*", "capacity": 0,
         "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]}


class Load:
    """Open-loop clients: requests arrive at each replica at its rate, whatever came back."""

    def __init__(self, gateways: list[str], seed: int) -> None:
        self.gateways = gateways
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.answers: dict[tuple[int, int], int] = {}  # (replica, status) -> count
        self.stopping = threading.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=48)
        self.threads = [threading.Thread(target=self.arrive, args=(i,)) for i in range(len(gateways))]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def arrive(self, i: int) -> None:
        with self.lock:
            r = random.Random(self.random.random())
        due = time.monotonic()
        while not self.stopping.is_set():
            due += r.expovariate(ARRIVALS[i])
            self.stopping.wait(max(0.0, due - time.monotonic()))  # the next arrival
            body = {"prompt": "x" * r.randint(*PROMPT), "max_tokens": r.choice(MAX_TOKENS)}
            self.pool.submit(self.send, i, json.dumps(body).encode())

    def send(self, i: int, body: bytes) -> None:
        req = urllib.request.Request(f"http://{self.gateways[i]}/v1/complete", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        except OSError:
            code = 0
        with self.lock:
            self.answers[(i, code)] = self.answers.get((i, code), 0) + 1

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join()
        self.pool.shutdown(wait=True)

    def count(self, code: int) -> int:
        with self.lock:
            return sum(n for (i, c), n in self.answers.items() if c == code)


def served(model: str) -> list[list[Any]]:
    with urllib.request.urlopen(f"http://{model}/v1/served", timeout=10) as r:
        return list(json.load(r))


def fullest_minute(calls: list[list[Any]]) -> tuple[float, float]:
    """The most tokens served in a 60 s window starting at a served call, and its start."""
    calls = sorted(calls)
    best, start, total, j = 0.0, 0.0, 0.0, 0
    for i, (t, _, tokens) in enumerate(calls):
        while j < len(calls) and calls[j][0] < t + 60:
            total += calls[j][2]
            j += 1
        if total > best:
            best, start = total, t
        total -= tokens
    return best, start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="the folder of doorman-node and doorman")
    p.add_argument("--duration", type=float, default=80, help="seconds of load (20 to 3600)")
    p.add_argument("--rate", type=float, default=2000, help="tokens a second for the fleet")
    p.add_argument("--budget", type=float, default=120000, help="tokens a UTC day for the fleet")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name, ok in [("--duration", 20 <= a.duration <= 3600), ("--rate", 100 <= a.rate <= 1e9),
                     ("--budget", 0 <= a.budget <= 1e12)]:
        if not ok:
            p.error(f"{name}: out of bounds")
    node, cli, env, logs = prepare(p, a.bin, "doorman-model-gateway-", config(a.rate, a.budget))
    children: list[Process] = []
    try:
        return run(a, node, cli, env, logs, children)
    finally:
        for c in reversed(children):
            c.stop()
        print(f"logs in {logs}")


def run(a: argparse.Namespace, node: str, cli: str, env: dict[str, str], logs: str,
        children: list[Process]) -> int:
    py = sys.executable
    print(f"starting the tree, the model and three gateways (logs in {logs}):")
    root = Process("root", [node, "--listen", "127.0.0.1:0", "--admin", "off", "--config",
                            os.path.join(logs, "resources.json")], logs)
    children.append(root)
    mid = Process("intermediate", [node, "--listen", "127.0.0.1:0", "--admin", "off", "--parent",
                                   root.address, "--id", "mid"], logs)
    children.append(mid)
    model = Process("model", [py, os.path.join(HERE, "model.py"), "--seed", str(a.seed)], logs, env)
    children.append(model)
    gateways = []
    for i in range(3):
        g = Process(f"gw-{i + 1}", [py, os.path.join(HERE, "gateway.py"), "--doorman", mid.address,
                                    "--model", "http://" + model.address, "--name", f"gw-{i + 1}"],
                    logs, env)
        children.append(g)
        gateways.append(g)
    print(f"  root          {root.address}  tokens-per-minute {a.rate:g}/s, tokens-per-day {a.budget:g}")
    print(f"  intermediate  {mid.address}  parent {root.address}")
    print(f"  model         {model.address}")
    for g, n in zip(gateways, ARRIVALS):
        print(f"  {g.name}          {g.address}  {n:g} requests/s arrive")
    print()

    load = Load([g.address for g in gateways], a.seed)
    began, wall = time.monotonic(), time.time()
    load.start()
    print("   t  " + "".join(f"{g.name:>9}" for g in gateways) + "  tokens/s   429s  day spent  unallotted")
    seen = 0
    for tick in range(1, int(a.duration // 10) + 1):
        time.sleep(max(0.0, began + 10 * tick - time.monotonic()))  # the next 10 s mark
        calls = served(model.address)
        fresh = calls[seen:]
        seen = len(calls)
        by = [sum(c[2] for c in fresh if c[1] == g.name) for g in gateways]
        b = budget_of(cli, root.address)
        print(f"{10 * tick:4d}s " + "".join(f"{n:9.0f}" for n in by)
              + f"  {sum(by) / 10:8.0f}  {load.count(429):5d}  {b.get('spent', 0):9.0f}  {b.get('left', 0):10.0f}",
              flush=True)
    load.stop()
    calls = served(model.address)
    for g in gateways:
        g.stop()
        print(g.log().strip().splitlines()[-1])
    print("\n$ doorman status --server " + root.address)
    print(subprocess.run([cli, "status", "--server", root.address], capture_output=True, text=True).stdout)
    return verdict(a, calls, wall, gateways)


def verdict(a: argparse.Namespace, calls: list[list[Any]], wall: float, gateways: list[Process]) -> int:
    largest = len(gateways) * (PROMPT[1] // 4 + max(MAX_TOKENS))  # one reservation each
    allowed = a.rate * 60 + 0.1 * a.rate + largest
    fullest, at = fullest_minute(calls)
    days: dict[int, float] = {}
    for t, _, tokens in calls:
        days[int(t // 86400)] = days.get(int(t // 86400), 0) + tokens
    over = max(0.0, max(days.values(), default=0) - a.budget)
    spent = sum(days.values())
    # Used up: the last 10 s served under a fifth of the rate while requests kept coming (the
    # budget, not the rate, held them back); then at least 95 % of it must have been spent.
    end = wall + 10 * int(a.duration // 10)
    last = sum(c[2] for c in calls if c[0] >= end - 10)
    used_up = len(days) == 1 and last < 0.2 * a.rate * 10
    minute_ok = fullest <= allowed
    day_ok = over == 0 and (not used_up or spent >= 0.95 * a.budget)
    print(f"{len(calls)} calls served; {spent:.0f} tokens")
    print(f"the fullest minute (from {at - wall:.1f} s): {fullest:.0f} tokens "
          f"({100 * fullest / (a.rate * 60):.1f} % of {a.rate * 60:.0f}); allowed {allowed:.0f} "
          f"(with bursts and a reservation per gateway): {'ok' if minute_ok else 'OVER'}")
    state = "used up" if used_up else "not used up within the run" if len(days) == 1 else \
        "the run crossed a UTC midnight: judged per day"
    print(f"the day's budget: {spent:.0f} of {a.budget:.0f} tokens ({100 * spent / max(a.budget, 1):.1f} %, "
          f"{state}), {over:.0f} over")
    print(f"every limit held: {'yes' if minute_ok and day_ok else 'NO'}")
    return 0 if minute_ok and day_ok else 1

if __name__ == "__main__":
    sys.exit(main())
