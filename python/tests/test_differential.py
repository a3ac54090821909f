"""The Python client's decisions against the C++ client's, step by step: seeded random traces
(resources attached and detached, uses of any n, time steps, the client's calls answered —
hostile answers included — or failed, closes) run through the Python sans-I/O core here and
through the C++ client's parts in tests/client_replay.cpp; every decision and, after every
step, every resource's capacity, lease and wants must be equal.

    /usr/bin/python3 python/tests/test_differential.py --replay BUILD/tests/doorman_client_replay \\
        [--traces 10000] [--seed 1] [--steps 60]

Exit 0 with "0 divergences"; else the first divergent trace's seed, step and both decisions.
Under pytest it runs 500 traces when DOORMAN_REPLAY_BINARY names the replay binary."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import unittest
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

from doorman._core import NEVER, ClientCore, ResourceOptions  # noqa: E402
from doorman._limiters import BudgetCounter, Gauge, RateLimiter  # noqa: E402

IDS = ["api", "db", "jobs", "x" * 40, "\u00e9t\u00e9"]


class Clock:
    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


class PythonReplay:
    """The Python core driven as client.py drives it, op by op (the ops of client_replay.cpp)."""

    def __init__(self, trace: dict[str, Any]) -> None:
        o = trace["options"]
        self.clock = Clock(trace["start"])
        self.core = ClientCore("replay", self.clock.now, seed=trace["seed"], clock=self.clock,
                               **trace["options"])
        self.closed = False
        self.slots: dict[str, list[int]] = {}  # each rate resource's admissions' slots

    def apply(self, s: list[Any]) -> Any:
        op, now, core = s[0], self.clock.now, self.core
        if op == "advance":
            self.clock.now += s[1]
            return None
        if op == "attach":
            if self.closed:
                return "closed"
            known = core.entries.get(s[1])
            try:
                core.attach(s[1], s[2], ResourceOptions(**s[3]), now)
            except ValueError:
                return "kind"
            return "shared" if known else "new"
        if op == "detach":
            gone = core.detach(s[1])
            if gone:  # the resource goes with its last handle, and its calls' slots
                self.slots.pop(s[1], None)
            return gone
        e = core.entries.get(s[1]) if len(s) > 1 and isinstance(s[1], str) else None
        if op == "try":
            if e is None or not isinstance(e.limiter, RateLimiter):
                return None
            got = e.limiter.try_acquire(s[2])
            if got.admitted:
                self.slots.setdefault(s[1], []).append(got.slot)
                return [True, 0.0]
            if got.retry_after == float("inf"):
                core.held_back(s[1], now)
                return [False, "never"]
            return [False, got.retry_after]
        if op == "reserve":
            if e is None or not isinstance(e.limiter, RateLimiter) or self.closed:
                return None
            at, slot = e.limiter.reserve_slot(s[2])
            if at == NEVER:
                core.held_back(s[1], now)
                return "never"
            self.slots.setdefault(s[1], []).append(slot)
            return at - now
        if op == "settle":
            if e is None or not isinstance(e.limiter, RateLimiter):
                return None
            slots = self.slots.get(s[1], [])
            if s[4] == 0 or s[4] > len(slots):
                return e.limiter.settle(s[2], s[3])
            return e.limiter.settle(s[2], s[3], slots[-s[4]])
        if op in ("gauge_try", "budget_try"):  # a closed client's limiters are closed
            if e is None or not isinstance(e.limiter, Gauge if op == "gauge_try" else BudgetCounter):
                return None
            if e.limiter.try_acquire(*s[2:]):
                return True
            core.held_back(s[1], now)
            return False
        if op == "budget_settle":
            if e is None or not isinstance(e.limiter, BudgetCounter):
                return None
            window = e.limiter.window  # the call's: s[4] windows before the counter's
            return e.limiter.settle(s[2], s[3], window - min(s[4], window))
        if op == "answers":  # a handle's record_answers
            if e is not None:
                e.answers += s[2]
                e.overloads += min(s[3], s[2])
            return None
        if op == "gauge_release":
            if e is not None and isinstance(e.limiter, Gauge) and e.limiter.in_use > 0:
                e.limiter.release()
            return None
        if op == "step":
            step = core.step(now)
            if step.action == "wait":
                return {"action": "wait", "at": "never" if step.at == NEVER else step.at - now}
            if step.action == "release":
                return {"action": "release", "params": step.params["resources"],
                        "spends": step.params.get("spends", [])}
            return {"action": "refresh", "params": step.params, "timeout": step.timeout}
        if op == "answer":
            return core.answered(s[1], now)[0]
        if op == "fail":
            return core.failed(now)
        if op == "close":
            self.closed = True
            return list(core.close())
        raise ValueError(f"unknown op {op}")

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for rid, e in sorted(self.core.entries.items()):
            out[rid] = [e.capacity, e.leased, self.core.wants(rid)]
            if isinstance(e.limiter, BudgetCounter):
                out[rid] += [e.limiter.left(), e.limiter.spent]
        return out


def _number(rng: random.Random) -> Any:
    """A number for a grant: mostly sound, sometimes out of bounds or not a number."""
    r = rng.random()
    if r < 0.85:
        return rng.choice([0, 1, 2.5, 10, 100, 1e3, rng.uniform(0, 50), rng.randrange(0, 200)])
    return rng.choice([-1, -0.5, 2e15, 1e7, "5", None, True, [], {}])


def _grant(rng: random.Random, rid: str) -> dict[str, Any]:
    g: dict[str, Any] = {
        "resource_id": rid,
        "gets": {
            "capacity": rng.choice([0, 1, 5, 20, 100, rng.uniform(0, 60), rng.randrange(0, 30)]),
            "expires_in": rng.choice([0.5, 2, 5, 10, rng.uniform(0, 20)]),
            "refresh_interval": rng.choice([0, 0.3, 1, 2, 5, rng.uniform(0, 8)]),
        },
    }
    if rng.random() < 0.7:
        g["safe_capacity"] = rng.choice([-1, 0, 1, 3, 10, rng.uniform(0, 20)])
    if rng.random() < 0.1:  # one number hostile
        where = rng.choice(["capacity", "expires_in", "refresh_interval", "safe_capacity"])
        (g if where == "safe_capacity" else g["gets"])[where] = _number(rng)
    if rng.random() < 0.4:  # a budget's state: mostly the window under way, sometimes the next
        g["budget"] = {"window": rng.choice([1764374400, 1764374400, 1764378000]),
                       "reset": 600, "limit": 1000, "spent": 250, "left": 700}
        if rng.random() < 0.05:  # hostile
            g["budget"][rng.choice(["window", "reset", "left"])] = rng.choice(
                [-1, 1.5, 2e11, "x", None, True])
    return g


def make_answer(rng: random.Random, asked: list[str]) -> Any:
    """The server's result for a request that asked for `asked`: mostly a grant per resource,
    sometimes hostile (a grant not asked for, twice, a bad shape, not master, not an object)."""
    r = rng.random()
    if r < 0.04:
        return rng.choice([None, [], "ok", 3, {"mastership": {"is_master": True}}])
    if r < 0.08:
        return {"mastership": {"is_master": False, "master": rng.choice([None, "10.0.0.1:1"])},
                "resources": []}
    grants = [_grant(rng, rid) for rid in asked if rng.random() < 0.9]
    if rng.random() < 0.1:
        grants.append(_grant(rng, rng.choice(IDS + ["other"])))  # not asked, or twice
    if rng.random() < 0.03:
        grants.append(rng.choice(["x", 1, None, {"resource_id": "api"}, {"gets": {}}]))
    rng.shuffle(grants)
    return {"mastership": {"is_master": True, "master": None}, "resources": grants}


def make_trace(seed: int, steps: int) -> dict[str, Any]:
    """A trace, made while the Python core runs it (so that answers answer its requests)."""
    rng = random.Random(seed)
    trace: dict[str, Any] = {
        "seed": rng.getrandbits(64),
        "start": rng.randrange(10**9, 10**13),
        "options": {
            "call_timeout": rng.choice([1.0, 5.0]),
            "minimum_refresh_interval": rng.choice([0.0, 1.0, 2.0]),
            "sample_interval": rng.choice([0.5, 1.0]),
            "demand_window": rng.choice([3.0, 10.0]),
            "throttled_headroom": rng.choice([1.0, 2.0]),
        },
        "steps": [],
    }
    py = PythonReplay(trace)
    ids = rng.sample(IDS, rng.randrange(1, 4))
    pending: Optional[dict[str, Any]] = None
    for _ in range(steps):
        if pending is not None:  # the step's call comes back first
            if rng.random() < 0.75:
                asked = ([r["resource_id"] for r in pending["params"]["resources"]]
                         if pending["action"] == "refresh" else [])
                s: list[Any] = ["answer", make_answer(rng, asked)]
            else:
                s = ["fail"]
            pending = None
        else:
            s = _op(rng, ids)
        trace["steps"].append(s)
        out = py.apply(s)
        if s[0] == "step" and isinstance(out, dict) and out["action"] != "wait":
            pending = out
    return trace


def _op(rng: random.Random, ids: list[str]) -> list[Any]:
    r = rng.random()
    rid = rng.choice(ids)
    if r < 0.25:
        return ["advance", rng.choice([1, 10**6, 10**8, 3 * 10**8, 10**9, rng.randrange(1, 4 * 10**9)])]
    if r < 0.35:
        kind = rng.choice(["gauge", "rate", "rate", "budget"])
        return ["attach", rid, kind, {
            "wants": rng.choice([None, None, 0.0, 5.0, 50.0]),
            "priority": rng.randrange(0, 3),
            "mode": rng.choice(["safe", "optimistic", "pessimistic"]),
            "safe_capacity": rng.choice([None, None, -1.0, 0.0, 4.0]),
            "burst": 0.0 if kind != "rate" else rng.choice([0.0, 0.0, 1.0, 3.0]),
        }]
    if r < 0.38:
        return ["detach", rid]
    if r < 0.58:
        return ["try", rid, rng.choice([1, 1, 1, 0.5, 2, 7, 30])]
    if r < 0.60:
        return ["reserve", rid, rng.choice([1, 2, 10])]
    if r < 0.63:
        return ["settle", rid, rng.choice([1, 2, 10]), rng.choice([0, 0.5, 1, 3, 25]),
                rng.choice([0, 1, 1, 1, 2, 3])]
    if r < 0.67:
        return ["budget_try", rid, rng.choice([1, 5, 20, 60, 0.5])]
    if r < 0.69:
        return ["budget_settle", rid, rng.choice([1, 5, 20]), rng.choice([0, 3, 5, 40]),
                rng.choice([0, 0, 1])]
    if r < 0.72:
        return ["gauge_try", rid]
    if r < 0.74:
        return ["gauge_release", rid]
    if r < 0.77:  # what the protected service answered: some overloaded, or none
        calls = rng.choice([1, 5, 50, 300])
        return ["answers", rid, calls, rng.choice([0, 0, 0, 1, 5, 50, calls, 2 * calls])]
    if r < 0.995:
        return ["step"]
    return ["close"]


def _normal(x: Any) -> Any:
    return json.loads(json.dumps(x))


def run(replay: str, traces: int, first_seed: int, steps: int) -> tuple[int, str]:
    """Runs `traces` traces through both; (divergences, the first one told)."""
    made = [make_trace(first_seed + i, steps) for i in range(traces)]
    text = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in made)
    out = subprocess.run([replay], input=text.encode(), capture_output=True, check=True)
    lines = out.stdout.decode().splitlines()
    if len(lines) != len(made):
        return len(made), f"the replay answered {len(lines)} traces of {len(made)}"
    divergences, first = 0, ""
    for i, (trace, line) in enumerate(zip(made, lines)):
        theirs = json.loads(line)
        if isinstance(theirs, dict):
            divergences += 1
            first = first or f"seed {first_seed + i}: the replay failed: {theirs['error']}"
            continue
        py = PythonReplay(trace)
        for k, s in enumerate(trace["steps"]):
            mine = _normal([py.apply(s), py.snapshot()])
            if mine != theirs[k]:
                divergences += 1
                first = first or (f"seed {first_seed + i}, step {k} {json.dumps(s)[:200]}:\n"
                                  f"  python: {json.dumps(mine)[:600]}\n"
                                  f"  c++:    {json.dumps(theirs[k])[:600]}")
                break
    return divergences, first


class SignalsTest(unittest.TestCase):
    def test_a_refresh_carries_the_answers_recorded_up_to_it(self) -> None:
        # Demand sampled once a minute: the root divides each report's counts by the time
        # between reports, so a refresh carries the counts at its send, not the last sample's.
        clock = Clock(10**12)
        core = ClientCore("c", clock.now, clock=clock, sample_interval=60.0,
                          minimum_refresh_interval=0.0)
        e = core.attach("api", "rate", ResourceOptions(wants=1), clock.now)
        e.answers, e.overloads = 7, 2
        step = core.step(clock.now)
        self.assertEqual(step.action, "refresh")
        items = {i["resource_id"]: i for i in step.params["resources"]}
        self.assertEqual(items["api"].get("signals"), {"calls": 7.0, "overloads": 2.0})


class DifferentialTest(unittest.TestCase):
    @unittest.skipUnless(os.environ.get("DOORMAN_REPLAY_BINARY"), "DOORMAN_REPLAY_BINARY unset")
    def test_the_python_core_decides_as_the_cpp_client(self) -> None:
        divergences, first = run(os.environ["DOORMAN_REPLAY_BINARY"], 500, 1, 60)
        self.assertEqual(divergences, 0, first)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replay", required=True, help="the doorman_client_replay binary")
    p.add_argument("--traces", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1, help="the first trace's seed")
    p.add_argument("--steps", type=int, default=60, help="operations per trace")
    a = p.parse_args()
    start = time.monotonic()
    divergences, first = run(a.replay, a.traces, a.seed, a.steps)
    print(f"{a.traces} traces of {a.steps} steps (seeds {a.seed}-{a.seed + a.traces - 1}): "
          f"{divergences} divergences, {time.monotonic() - start:.1f} s")
    if first:
        print("first:", first)
    return 0 if divergences == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
