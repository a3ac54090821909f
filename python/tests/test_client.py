"""The Python client against real doorman-node processes on loopback (and fake servers for the
faults a node does not make on demand). Run by `make test` through ctest:
    DOORMAN_NODE_BINARY=build/dev/examples/doorman-node /usr/bin/python3 -m unittest ...
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

import doorman  # noqa: E402
from support import (  # noqa: E402
    Etcd, FakeServer, Node, budget_config, config, eventually, free_port, free_port_refusing,
    long_run)


def fast(address: str, **kw) -> doorman.Client:  # type: ignore[no-untyped-def]
    return doorman.Client(address, minimum_refresh_interval=0.1, sample_interval=0.2,
                          demand_window=1.0, **kw)


SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


class Replicas:
    """Replicas (replica.py processes) of `kind` "budget" (spending the budget "tokens") or
    "rate" (calling through the rate resource "api") through `addresses`, each logging what
    it reserves and settles (asking to hold `wants`, if given, rather than what it
    measures)."""

    def __init__(self, addresses: str, *wants: str, kind: str = "budget", count: int = 3
                 ) -> None:
        self.work = tempfile.mkdtemp(prefix=f"doorman-py-{kind}-")
        package = os.path.dirname(os.path.dirname(os.path.abspath(doorman.__file__)))
        env = {**os.environ, "PYTHONPATH": package}
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replica.py")
        self.logs = [os.path.join(self.work, f"replica-{i}.log") for i in range(count)]
        self.killed: set[int] = set()
        self.procs: list[subprocess.Popen[bytes]] = []
        for i, log in enumerate(self.logs):
            open(log, "w").close()
            self.procs.append(subprocess.Popen(
                ["/usr/bin/python3", script, kind, addresses, log, str(i), *wants], env=env))

    def __enter__(self) -> "Replicas":
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def calls(self, i: int) -> list[tuple[float, float]]:
        """Replica `i`'s calls, as (admitted at, settled cost), in order; its last reservation
        at its full size if it was killed during that call."""
        out: list[tuple[float, float]] = []
        at = 0.0
        reserved = None
        with open(self.logs[i]) as f:
            for line in f:
                words = line.split()
                if len(words) == 3 and words[0] == "reserve":
                    reserved, at = float(words[1]), float(words[2])
                elif len(words) == 2 and words[0] == "settle" and reserved is not None:
                    out.append((at, float(words[1])))
                    reserved = None
        if i in self.killed and reserved is not None:
            out.append((at, reserved))  # killed in the middle of a call
        return out

    def spent(self, i: int) -> float:
        """What replica `i` settled, plus its last reservation if it was killed during it."""
        return sum(cost for _, cost in self.calls(i))

    def total(self) -> float:
        return sum(self.spent(i) for i in range(len(self.logs)))

    def known_to(self, node: Node) -> bool:
        """Whether replica 0 holds a lease at `node` (client ids are hostname:pid:n)."""
        mark = f":{self.procs[0].pid}:"
        return any(mark in k for k in node.leases("tokens"))

    def kill(self, i: int) -> None:
        self.killed.add(i)
        self.procs[i].kill()  # SIGKILL, most likely in the middle of a call
        self.procs[i].wait(10)

    def settled(self, least: float) -> bool:
        """Whether a span of 1.5 s passed with no spend at all, above `least`."""
        before = self.total()
        time.sleep(1.5)  # a span with no spend at all: nothing more is allotted
        return self.total() == before and before > least

    def stop(self) -> None:
        """Asks the live replicas to stop, and waits for them."""
        for i, log in enumerate(self.logs):
            if i not in self.killed:
                open(log + ".stop", "w").close()
        for i, p in enumerate(self.procs):
            if i not in self.killed:
                p.wait(15)


def judge_costs(calls: list[list[tuple[float, float]]], capacity: float, start: float,
                end: float, latency: float, window: float = 60) -> dict[str, float]:
    """The promise of calls of any cost, checked on each replica's calls (admitted at, settled
    cost) between `start` and `end` (docs/budgets.md, "Calls of any cost"): the most the calls
    of any `window` cost, against capacity x window plus each replica's largest call; the
    share of the capacity used; and how late past its due time a call was admitted at worst
    (due: the replica's previous admission plus the longer of the call's `latency` and the
    previous call's cost at a fair share of the capacity)."""
    fair = capacity / len(calls)
    judged: list[tuple[float, float]] = []
    late = 0.0
    largest = 0.0
    for mine in calls:
        largest += max((cost for _, cost in mine), default=0.0)
        for (before, cost), (at, _) in zip(mine, mine[1:]):
            if start <= at < end:
                late = max(late, at - (before + max(latency, cost / fair)))
        judged += [(at, cost) for at, cost in mine if start <= at < end]
    judged.sort()
    worst = in_window = 0.0
    first = 0
    for at, cost in judged:
        in_window += cost
        while judged[first][0] <= at - window:
            in_window -= judged[first][1]
            first += 1
        worst = max(worst, in_window)
    spent = sum(cost for _, cost in judged)
    return {"calls": len(judged), "worst": worst, "bound": capacity * window + largest,
            "used": spent / (capacity * (end - start)), "late": late}


class ClientTest(unittest.TestCase):
    def test_a_call_bounded_by_a_lease_reaches_a_peer_back_within_the_backoff(self) -> None:
        # A peer restarts: refused, the channel backs off 2-4 s. A refresh with 2 s of lease
        # left calls with a deadline of 1 s; the peer is back: the call must try it in time,
        # one early attempt a call (as the C++ channel's test).
        from doorman._channel import CallError, Channel
        master = {"result": {"mastership": {"is_master": True, "master": None}}}
        server = FakeServer(lambda req: master)
        ch = Channel([server.address], initial_backoff=4, maximum_backoff=4)
        try:
            ch.call("discovery", {}, time.monotonic() + 1)
            server.refuse()
            with self.assertRaises(CallError):
                ch.call("discovery", {}, time.monotonic() + 1)
            self.assertGreaterEqual(ch.failures, 1)
            server.refusing = False
            start = time.monotonic()
            ch.call("discovery", {}, start + 1)
            self.assertLess(time.monotonic() - start, 1)
            self.assertEqual(ch.failures, 0)
            server.refuse()
            with self.assertRaises(CallError):
                ch.call("discovery", {}, time.monotonic() + 1)
            failures = ch.failures
            with self.assertRaises(CallError):
                ch.call("discovery", {}, time.monotonic() + 0.2)  # its early attempt, then none
            self.assertEqual(ch.failures, failures + 1)
        finally:
            ch.close()
            server.close()

    def setUp(self) -> None:
        self.nodes: list[Node] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def nodes_dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="doorman-py-test-")
            self.addCleanup(self._dir.cleanup)
        return self._dir.name

    def tearDown(self) -> None:
        for n in self.nodes:
            n.stop()

    def node(self, conf, *extra: str) -> Node:  # type: ignore[no-untyped-def]
        n = Node(conf, *extra)
        self.nodes.append(n)
        return n

    def test_fixed_wants_are_granted_and_shared_fairly(self) -> None:
        n = self.node(config(100))
        with fast(n.address) as a, fast(n.address) as b:
            ra = a.rate("api", wants=80)
            self.assertTrue(eventually(lambda: ra.capacity == 80))
            rb = b.rate("api", wants=80)
            # FAIR_SHARE: 50 each once both have refreshed.
            self.assertTrue(eventually(lambda: ra.capacity == 50 and rb.capacity == 50),
                            (ra.capacity, rb.capacity))
            self.assertTrue(ra.leased)
            self.assertEqual(n.leases("api"), {a.client_id: 50, b.client_id: 50})

    def test_a_settled_debt_holds_the_next_call_back(self) -> None:
        n = self.node(config(100))
        with fast(n.address) as c:
            api = c.rate("api", wants=10, burst=2)
            self.assertTrue(eventually(lambda: api.capacity == 10))
            self.assertTrue(api.try_acquire(2))  # the burst, at an estimate of 2
            self.assertTrue(api.settle(2, 12))  # it cost 12: 10 owed, a second at 10/s
            refused = api.try_acquire(1)
            self.assertFalse(refused)
            self.assertGreater(refused.retry_after, 0.9)
            with self.assertRaisesRegex(ValueError, "^used: must be a finite number >= 0"):
                api.settle(1, -1)
            api.close()
            with self.assertRaisesRegex(ValueError, "this handle is closed"):
                api.settle(1, 1)

    @long_run
    def test_calls_of_heavy_tailed_cost_keep_every_minute_within_capacity(self) -> None:
        # Ten replicas call through an intermediate and a root, each call reserving an
        # estimate (1 000 units) and settling its real cost, 100 to 30 000 units: up to 10
        # times the burst a replica's share gives it (a tenth of a second of 30 000 units/s).
        # Demand exceeds the capacity. In every 60 s window the calls admitted cost at most the
        # capacity's 60 s plus each replica's largest call; at least 95 % of the capacity is
        # used; no call is admitted later than its due time plus one refresh interval (1 s).
        capacity, count, length = 300_000.0, 10, 80.0
        root = self.node(config(capacity, lease_length=10))
        mid = self.node(config(capacity, lease_length=10), "--parent", root.address)
        with Replicas(mid.address, kind="rate", count=count) as replicas:
            self.assertTrue(eventually(lambda: all(replicas.calls(i) for i in range(count)),
                                       timeout=20))
            start = time.monotonic() + 10  # each replica's lease has settled on its share
            time.sleep(start + length - time.monotonic())  # the run being measured
            end = time.monotonic()
            replicas.stop()
            v = judge_costs([replicas.calls(i) for i in range(count)], capacity, start, end,
                            latency=0.005)
        print(f"{v['calls']} calls; the fullest minute {v['worst']:.0f} of {v['bound']:.0f} "
              f"allowed ({capacity * 60:.0f} + the largest calls); {v['used']:.1%} used; the "
              f"latest call {max(0.0, v['late']):.3f} s past due")
        self.assertGreater(v["calls"], 10_000)
        self.assertLessEqual(v["worst"], v["bound"])
        self.assertGreaterEqual(v["used"], 0.95)
        self.assertLessEqual(v["late"], 1.0)

    def test_a_budget_spends_its_allotment_settles_reports_and_frees_the_rest(self) -> None:
        n = self.node(budget_config(1000))

        def at_root() -> dict[str, float]:
            st = n.call("status", {"resource_id": "tokens"})["result"]
            return st["resources"][0]["budget"]

        with fast(n.address) as a, fast(n.address) as b:
            ta = a.budget("tokens", wants=400)
            tb = b.budget("tokens", wants=400)
            self.assertTrue(eventually(lambda: ta.left == 400 and tb.left == 400),
                            (ta.left, tb.left))
            w = ta.window
            self.assertTrue(ta.try_acquire(300))
            self.assertFalse(ta.try_acquire(200))  # 100 left: all or nothing
            self.assertTrue(ta.settle(300, 350, w))  # it cost more: 50 left
            self.assertEqual(ta.left, 50)
            self.assertEqual(ta.spent, 350)
            with self.assertRaisesRegex(ValueError, "^n: must be a finite number >= 0"):
                ta.try_acquire(-1)
            w = tb.window
            self.assertTrue(tb.try_acquire(100))
            self.assertTrue(tb.settle(100, 40, w))  # a refund: back at once
            self.assertEqual(tb.left, 360)
            # The reports ride on the refreshes.
            self.assertTrue(eventually(lambda: at_root()["spent"] >= 390), at_root())
            self.assertLessEqual(at_root()["spent"], 450)
            # The last handle's release carries the last report: a's rest is free at once.
            ta.close()
            self.assertTrue(eventually(lambda: len(n.leases("tokens")) == 1))
            self.assertLessEqual(at_root()["spent"], 450)
            # b, released too, comes back asking for more than there is: it gets what is left.
            tb.close()
            self.assertTrue(eventually(lambda: not n.leases("tokens")))
            spent = at_root()["spent"]
            self.assertLessEqual(spent, 450)
            tb = b.budget("tokens", wants=5000)
            self.assertTrue(eventually(lambda: tb.left > 500), tb.left)
            self.assertEqual(tb.left, 1000 - spent)
        self.assertFalse(tb.try_acquire(1))  # closed is closed

    def test_a_rate_handle_on_a_budget_takes_nothing_and_asks_for_nothing(self) -> None:
        # A rate handle on the id of a day's budget would spend each allotment of units as a
        # rate of units a second. It takes 0, says why, and asks for 0 from then on: the root
        # counts at most its first allotment as spent (it never reports), then nothing.
        n = self.node(budget_config(1000))
        lines: list[str] = []
        with fast(n.address, log=lines.append) as c:
            r = c.rate("tokens", wants=100)
            self.assertTrue(eventually(lambda: any("is a budget at the server" in l for l in lines)),
                            lines)
            self.assertFalse(r.try_acquire())
            self.assertEqual(r.capacity, 0)
            self.assertTrue(eventually(lambda: n.leases("tokens") == {c.client_id: 0.0}),
                            n.leases("tokens"))
            st = n.call("status", {"resource_id": "tokens"})["result"]["resources"][0]["budget"]
            self.assertLessEqual(st["spent"], 100)
            self.assertEqual(sum("is a budget at the server" in l for l in lines), 1)

    def test_without_log_a_wrong_handle_is_told_through_the_logging_module(self) -> None:
        # Without `log=`, what the client would tell goes to the "doorman" logger (at WARNING:
        # Python's last-resort handler prints it when nothing is configured): a budget handle on
        # a rate resource refuses forever, and says why, once.
        n = self.node(config(1000))
        with self.assertLogs("doorman", level="WARNING") as seen:
            with fast(n.address) as c:
                b = c.budget("api", wants=100)
                self.assertTrue(eventually(
                    lambda: any("is not a budget at the server" in m for m in seen.output)),
                    seen.output)
                self.assertFalse(b.try_acquire(1))
        self.assertEqual(sum("is not a budget at the server" in m for m in seen.output), 1)

    def test_overloads_recorded_cut_the_client_at_once_and_the_root_learns_them(self) -> None:
        # A learned capacity of 1000: the client's calls meet 40 % overloads. It cuts itself
        # to what got through within a second, tells the root early, and the root cuts.
        learned = {"identifier_glob": "provider", "capacity": 1000,
                   "learn": {"min": 100, "max": 5000},
                   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 5,
                                 "refresh_interval": 1, "learning_mode_duration": 0}}
        n = self.node({"resources": [learned] + config(0)["resources"]})
        with fast(n.address) as c:
            p = c.rate("provider", wants=2000)
            self.assertTrue(eventually(lambda: p.capacity == 1000))
            with self.assertRaises(ValueError):
                p.record_answers(-1)

            def status() -> dict[str, Any]:
                return n.call("status", {"resource_id": "provider"})["result"]["resources"][0]

            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and status()["capacity"] > 700:
                p.record_answers(100, 40)  # 1000 calls a second, 400 of them overloaded
                time.sleep(0.1)
            st = status()
            self.assertLess(st["capacity"], 700, st)  # about 600 got through, less 3 %
            self.assertGreaterEqual(st["capacity"], 500)  # a cut takes at most half
            self.assertEqual(st["learned"]["min"], 100)
            self.assertLess(p.capacity, 700)  # its own cut, or the root's

    def test_a_budget_wait_takes_units_as_they_come_and_ends_in_time(self) -> None:
        n = self.node(budget_config(1000))
        with fast(n.address) as c:
            # It wants the whole budget: once it took all, only a refund brings more.
            t = c.budget("tokens", wants=1000)
            t.wait(60, timeout=10)  # before the first answer: once the allotment comes
            self.assertEqual(t.spent, 60)
            with self.assertRaises(TimeoutError):  # past the whole budget
                t.wait(5000, timeout=0.3)
            self.assertEqual(t.spent, 60)
            self.assertTrue(eventually(lambda: t.left == 940))
            self.assertTrue(t.try_acquire(940))
            woken = threading.Event()

            def waiter() -> None:
                t.wait(10, timeout=10)
                woken.set()

            threading.Thread(target=waiter).start()
            self.assertFalse(woken.wait(0.05))
            t.settle(40, 20, t.window)  # a refund wakes it (the window's own call)
            self.assertTrue(woken.wait(10))
            self.assertEqual(t.spent, 990)  # 1000, 20 back, 10 taken again
            ended: list[BaseException] = []

            def stopped() -> None:
                try:
                    t.wait(5000)
                except doorman.ClientClosed as e:
                    ended.append(e)

            th = threading.Thread(target=stopped)
            th.start()
        th.join(10)
        self.assertEqual(len(ended), 1)  # close() ended it

    def test_fast_start_then_measured_wants(self) -> None:
        n = self.node(config(100))
        with fast(n.address) as c:
            api = c.rate("api")  # measured: first asked for with 0, granted 0
            self.assertTrue(eventually(lambda: api.leased))
            first = api.try_acquire()
            self.assertFalse(first)
            self.assertEqual(first.retry_after, math.inf)
            # Held back by 0: the start wants (the server's safe capacity, here 100) at once.
            self.assertTrue(eventually(lambda: api.capacity > 0, timeout=5))
            self.assertTrue(api.try_acquire())
            # Used at about 20 a second, the wants follow the use.
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                api.wait(1)
                time.sleep(0.05)  # the traffic: about 20 a second
            self.assertLess(api.wants, 60)
            self.assertGreater(api.wants, 5)

    def test_fast_start_when_used_before_the_first_answer(self) -> None:
        # The first answer is slow: the resource is used (and held back by 0) before it comes.
        # Its start wants (the server's safe capacity) must go out as soon as that answer tells
        # them, as the C++ client does, not 1 permit/s for a whole refresh interval.
        asked: list[float] = []

        def answer(req):  # type: ignore[no-untyped-def]
            if req["method"] != "get_capacity":
                return {"jsonrpc": "2.0", "id": req["id"], "result": {}}
            wants = req["params"]["resources"][0]["wants"]
            asked.append(wants)
            if len(asked) == 1:
                time.sleep(0.5)  # the slow first answer
            return {"jsonrpc": "2.0", "id": req["id"], "result": {
                "resources": [{"resource_id": "api", "safe_capacity": 100, "gets": {
                    "capacity": min(wants, 100) if len(asked) > 1 else 0,
                    "expires_in": 60, "refresh_interval": 16}}],
                "mastership": {"is_master": True}}}

        server = FakeServer(answer)
        try:
            with doorman.Client(server.address, minimum_refresh_interval=0.1) as c:
                api = c.rate("api")  # measured
                got = api.try_acquire()  # before the first answer: held back
                self.assertFalse(got)
                self.assertTrue(eventually(lambda: api.capacity >= 90, timeout=3),
                                (asked, api.capacity))
        finally:
            server.close()

    def test_release_on_close_and_on_the_last_handle(self) -> None:
        n = self.node(config(100))
        c = fast(n.address)
        a = c.rate("a", wants=10)
        b = c.gauge("b", wants=3)
        self.assertTrue(eventually(lambda: a.capacity == 10 and b.capacity == 3))
        a.close()  # the last handle of "a": released
        self.assertTrue(eventually(lambda: n.leases("a") == {}))
        self.assertEqual(n.leases("b"), {c.client_id: 3})
        start = time.monotonic()
        c.close()
        self.assertLess(time.monotonic() - start, 1.5)
        self.assertEqual(n.leases("b"), {})
        with self.assertRaises(doorman.ClientClosed):
            c.rate("c")

    def test_gauge_slots(self) -> None:
        n = self.node(config(100))
        with fast(n.address) as c:
            jobs = c.gauge("jobs", wants=2)
            self.assertTrue(eventually(lambda: jobs.capacity == 2))
            with jobs.acquire():
                with jobs.acquire():
                    self.assertEqual(jobs.in_use, 2)
                    self.assertFalse(jobs.try_acquire())
                    with self.assertRaises(TimeoutError):
                        jobs.acquire(timeout=0.1)
            self.assertEqual(jobs.in_use, 0)

    def test_fallback_after_the_tree_goes_away(self) -> None:
        n = self.node(config(100, lease_length=2, safe_capacity=7))
        with fast(n.address, call_timeout=0.5) as c:
            safe = c.rate("s", wants=50)
            pess = c.rate("p", wants=50, mode="pessimistic")
            opt = c.rate("o", wants=30, mode="optimistic")
            self.assertTrue(eventually(lambda: safe.capacity == 50 and opt.capacity == 30))
            n.stop()
            # Leases run out within 2 s; then each fallback.
            self.assertTrue(eventually(lambda: not safe.leased, timeout=4))
            self.assertTrue(eventually(lambda: safe.capacity == 7 and pess.capacity == 0
                                       and opt.capacity == 30, timeout=2),
                            (safe.capacity, pess.capacity, opt.capacity))

    def test_redirect_to_the_master(self) -> None:
        master = self.node(config(100))
        follower = FakeServer(lambda req: {"result": {
            "mastership": {"is_master": False, "master": master.address}, "resources": []}})
        try:
            with fast(follower.address) as c:
                api = c.rate("api", wants=5)
                self.assertTrue(eventually(lambda: api.capacity == 5))
                self.assertEqual(master.leases("api"), {c.client_id: 5})
        finally:
            follower.close()

    def test_two_roots_electing_and_a_master_change(self) -> None:
        if not os.path.exists("/usr/bin/etcd"):
            self.skipTest("no /usr/bin/etcd (Debian: etcd-server)")
        etcd = Etcd()
        try:
            election = ("--etcd-endpoints", etcd.endpoint, "--election-key", "/doorman/py-test",
                        "--election-ttl", "2")
            first = self.node(config(100), *election)
            self.assertTrue(eventually(first.is_master))
            second = self.node(config(100), *election)
            with fast(f"{second.address},{first.address}", call_timeout=1) as c:
                api = c.rate("api", wants=10)
                self.assertTrue(eventually(lambda: api.capacity == 10))
                self.assertEqual(first.leases("api"), {c.client_id: 10})  # the master's
                first.kill()  # the master dies; the other wins once its lease expires (2 s)
                self.assertTrue(eventually(second.is_master, timeout=15))
                # The client's refreshes go to the new master, which then holds its lease.
                self.assertTrue(eventually(lambda: second.leases("api") == {c.client_id: 10},
                                           timeout=15))
                self.assertEqual(api.capacity, 10)
        finally:
            etcd.stop()

    @long_run
    def test_a_budget_shared_by_replicas_across_a_master_change_and_a_kill(self) -> None:
        # Three replicas (processes) spend one budget through two roots electing in etcd: the
        # master is killed, then a replica in the middle of a call. What they spent in all
        # never exceeds the budget, the root never counts less, and most of it is spent. (A
        # replica killed before a master change takes what it spent since its last report to
        # the old master with it: docs/budgets.md, "A master change".)
        units = 600_000
        conf, etcd = self.etcd_budget(units)
        try:
            election = ("--etcd-endpoints", etcd.endpoint, "--election-key", "/doorman/py-budget",
                        "--election-ttl", "2")
            first = self.node(conf, *election)
            self.assertTrue(eventually(first.is_master))
            second = self.node(conf, *election)
            with Replicas(f"{first.address},{second.address}") as replicas:
                self.assertTrue(eventually(lambda: replicas.spent(0) > 0.05 * units / 3))
                first.kill()  # the master goes; the other wins once its lease expires (2 s)
                self.assertTrue(eventually(second.is_master, timeout=15))
                # The replica to be killed has reported to the new master.
                self.assertTrue(eventually(lambda: replicas.known_to(second), timeout=15))
                self.check_spent_in_full(replicas, second, units)
        finally:
            etcd.stop()

    def test_a_budget_through_an_intermediate_killed_and_restarted(self) -> None:
        # Three replicas spend one budget through an intermediate, which is killed (SIGKILL)
        # and started again on its address; then a replica is killed in the middle of a call.
        # Never over the budget, never counted under, and the restart costs the
        # intermediate's allotment, not its replicas' spend again (docs/budgets.md, "Through
        # intermediates"). Each replica holds at most 20 000 units, so the intermediate at most
        # 60 000: what the two kills may cost is within the 20 % the check leaves.
        units = 600_000
        conf = budget_config(units, lease_length=3)
        root = self.node(conf)
        listen = f"127.0.0.1:{free_port()}"
        mid = self.node(conf, "--parent", root.address, "--listen", listen)
        with Replicas(mid.address, "20000") as replicas:
            self.assertTrue(eventually(lambda: replicas.spent(0) > 0.05 * units / 3))
            mid.kill()
            mid = self.node(conf, "--parent", root.address, "--listen", listen)
            self.assertTrue(eventually(lambda: replicas.known_to(mid), timeout=15))
            before = replicas.total()
            self.assertTrue(eventually(lambda: replicas.total() > before + 3000, timeout=15))
            self.check_spent_in_full(replicas, root, units)

    @long_run
    def test_a_day_budget_through_an_intermediate_across_a_master_change_and_a_kill(
            self) -> None:
        # A budget per UTC day, spent by three replicas through an intermediate whose parents
        # are two roots electing in etcd: the master is killed, then a replica in the middle
        # of a call. Never over, never counted under, at least 99 % spent, and the day's
        # budget is served as fast as the replicas ask (a burst far above 10 times the day's
        # average rate). Each replica holds at most 9 000 units: the killed one's allotment
        # and the allotments' ends too small for one more call are all that is lost.
        to_midnight = 86400 - time.time() % 86400
        if to_midnight < 120:  # the test must not straddle the day's end
            time.sleep(to_midnight + 1)
        units = 2_000_000
        conf, etcd = self.etcd_budget(units, 0.1)  # the day's budget spent in about a minute
        conf["resources"][0]["budget"]["window"] = "day"
        try:
            # No budget marks: each costs its step of the budget at a master change, more than
            # the 1 % this test leaves (test_a_budget_kept_in_etcd_... runs with them).
            election = ("--etcd-endpoints", etcd.endpoint, "--election-key", "/doorman/py-day",
                        "--election-ttl", "2", "--budget-mark-step", "0")
            first = self.node(conf, *election)
            self.assertTrue(eventually(first.is_master))
            second = self.node(conf, *election)
            mid = self.node(conf, "--parent", f"{first.address},{second.address}")
            start = time.monotonic()
            with Replicas(mid.address, "9000") as replicas:
                self.assertTrue(eventually(lambda: replicas.total() > 0.2 * units, timeout=60))
                first.kill()  # the master goes; the other wins once its lease expires (2 s)
                self.assertTrue(eventually(second.is_master, timeout=15))
                # The intermediate has reported to the new master, and spends on.
                self.assertTrue(eventually(lambda: second.leases("tokens"), timeout=15))
                before = replicas.total()
                self.assertTrue(eventually(lambda: replicas.total() > before + 9000, timeout=15))
                spent = self.check_spent_in_full(replicas, second, units, least=0.99)
            rate = spent / (time.monotonic() - start)
            print(f"served at {rate:.0f} units/s, {rate / (units / 86400):.0f} times the "
                  f"day's average rate")
            self.assertGreater(rate, 10 * units / 86400)
        finally:
            etcd.stop()

    def test_a_budget_kept_in_etcd_survives_the_loss_of_every_root(self) -> None:
        # Three replicas spend a budget through two roots electing in etcd, which keep the
        # budget's mark there. A replica is killed, and at once both roots (SIGKILL): what the
        # replica spent since its last report was never heard by any root. Two new roots come
        # up on the same addresses; the new master counts from the mark, so the replicas still
        # never pass the budget and the root never counts less than they spent
        # (docs/budgets.md, "When every root is lost").
        units = 600_000
        conf, etcd = self.etcd_budget(units, 0.1)
        try:
            election = ("--etcd-endpoints", etcd.endpoint, "--election-key", "/doorman/py-lost",
                        "--election-ttl", "2", "--budget-mark-step", "0.005")
            roots = [self.node(conf, *election)]
            self.assertTrue(eventually(roots[0].is_master))
            roots.append(self.node(conf, *election))
            addresses = [r.address for r in roots]
            with Replicas(",".join(addresses), "9000") as replicas:
                self.assertTrue(eventually(lambda: replicas.total() > 0.2 * units, timeout=60))
                replicas.kill(0)
                for r in roots:
                    r.kill()
                roots = [self.node(conf, *election, "--listen", a) for a in addresses]
                self.assertTrue(eventually(lambda: any(r.is_master() for r in roots),
                                           timeout=15))
                master = next(r for r in roots if r.is_master())
                self.assertTrue(eventually(lambda: replicas.settled(0.5 * units), timeout=90),
                                replicas.total())
                replicas.stop()
                spent = replicas.total()
                st = master.call("status", {"resource_id": "tokens"})["result"]["resources"][0]
                print(f"budget {units}: spent {spent:.0f} ({spent / units:.1%}); the new "
                      f"master counts {st['budget']['spent']}")
                self.assertLessEqual(spent, units)  # never over
                self.assertGreaterEqual(st["budget"]["spent"], spent)  # never counted under
                self.assertGreaterEqual(spent, 0.95 * units)
        finally:
            etcd.stop()

    def etcd_budget(self, units: float, refresh_interval: float | None = None
                    ) -> tuple[dict[str, Any], "Etcd"]:
        """A budget of `units` for roots electing in a real etcd (leases of 3 s, learning mode
        as long), and that etcd; skips the test without /usr/bin/etcd."""
        if not os.path.exists("/usr/bin/etcd"):
            self.skipTest("no /usr/bin/etcd (Debian: etcd-server)")
        conf = budget_config(units, lease_length=3)
        algorithm = conf["resources"][0]["algorithm"]
        algorithm["learning_mode_duration"] = 3  # >= the lease
        if refresh_interval is not None:
            algorithm["refresh_interval"] = refresh_interval
        return conf, Etcd()

    def check_spent_in_full(self, replicas: "Replicas", root: Node, units: float,
                            least: float = 0.8) -> float:
        """Kills replica 0 (most likely in the middle of a call), lets the others spend until
        nothing more comes (demand exceeds the budget), checks the totals against the budget
        and `root`'s count, and returns what the replicas spent."""
        replicas.kill(0)
        self.assertTrue(eventually(lambda: replicas.settled(0.5 * units), timeout=90),
                        replicas.total())
        replicas.stop()
        spent = [replicas.spent(i) for i in range(3)]
        st = root.call("status", {"resource_id": "tokens"})["result"]["resources"][0]
        print(f"budget {units}: spent {sum(spent):.0f} ({sum(spent) / units:.1%}) by the "
              f"replicas {[round(x) for x in spent]}; the root counts {st['budget']['spent']}")
        self.assertLessEqual(sum(spent), units)  # never over
        self.assertLessEqual(st["budget"]["spent"], units)
        self.assertGreaterEqual(st["budget"]["spent"], sum(spent))  # never counted under
        self.assertGreaterEqual(sum(spent), least * units)
        return sum(spent)

    def test_mutual_tls_with_real_certificates(self) -> None:
        certs = os.path.join(self.nodes_dir(), "certs")
        subprocess.run(["sh", os.path.join(SOURCE, "examples", "make_certs.sh"), certs],
                       check=True, capture_output=True)
        at = lambda name: os.path.join(certs, name)  # noqa: E731
        n = self.node(config(100), "--tls-cert", at("node.pem"), "--tls-key", at("node.key"),
                      "--tls-ca", at("ca.pem"), "--tls-client-auth", "require")
        # Its own identity's client ids only (no access file): spiffe://doorman.test/client/a#...
        ctx = doorman.tls_context(at("ca.pem"), at("client-a.pem"), at("client-a.key"))
        with fast(n.address, ssl_context=ctx, client_id="spiffe://doorman.test/client/a#py") as c:
            api = c.rate("api", wants=5)
            self.assertTrue(eventually(lambda: api.capacity == 5))
        # A certificate of another CA gets nothing: the handshake fails.
        lines: list[str] = []
        rogue = doorman.tls_context(at("ca.pem"), at("rogue.pem"), at("rogue.key"))
        with fast(n.address, ssl_context=rogue, log=lines.append, call_timeout=1) as c:
            api = c.rate("api", wants=5)
            self.assertTrue(eventually(lambda: len(lines) > 0))
            self.assertFalse(api.leased)
        # Nothing is held: the first client released on close, the rogue one got nothing. (Only
        # `status` without a resource is open to every identity when there is no access file.)
        st = n.call("status", {}, tls=ctx)["result"]
        self.assertEqual(sum(r["sum_has"] for r in st["resources"]), 0, st)
        with self.assertRaisesRegex(ValueError, "cert_file and key_file go together"):
            doorman.tls_context(at("ca.pem"), at("client-a.pem"))

    def test_released_at_interpreter_exit(self) -> None:
        n = self.node(config(100))
        script = (
            "import sys, time, doorman\n"
            f"c = doorman.Client({n.address!r}, release_timeout=0.5)\n"
            "r = c.rate('x', wants=3)\n"
            "deadline = time.monotonic() + 10\n"
            "while r.capacity != 3 and time.monotonic() < deadline:\n"
            "    time.sleep(0.02)  # polling the lease\n"
            "print(r.capacity, flush=True)\n"  # and exit without close()
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        start = time.monotonic()
        out = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True,
                             env=env, timeout=30)
        self.assertEqual(out.stdout.strip(), "3.0", out.stderr)
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(n.leases("x"), {})  # released by the exit hook

    def test_backoff_when_refused(self) -> None:
        refused = free_port_refusing()
        with doorman.Client(refused, minimum_refresh_interval=0.1, call_timeout=0.5) as c:
            c.rate("api", wants=1)
            time.sleep(3)  # the measured span: how many attempts 3 s of refusals cost
            attempts = c._channel.connects
        # Backing off (0.05 s doubling to 5 s, jittered) and refreshing (0.5 s doubling):
        # a handful of attempts, not thousands.
        self.assertGreater(attempts, 1)
        self.assertLess(attempts, 20)

    def test_a_refusal_is_said_as_the_node_said_it(self) -> None:
        # A node over --max-connections answers -32000 with retry_after, then closes: the
        # client's log says so, not "connection lost".
        n = Node(config(10), "--max-connections", "1")
        host, port = n.address.rsplit(":", 1)
        holder = socket.create_connection((host, int(port)))  # the one connection allowed
        try:
            holder.sendall(b'{"jsonrpc":"2.0","id":1,"method":"discovery","params":{}}\n')
            holder.recv(4096)  # answered: it holds the slot
            lines: list[str] = []
            with doorman.Client(n.address, log=lines.append, call_timeout=0.5) as c:
                c.rate("api", wants=1)
                self.assertTrue(eventually(lambda: any("refresh failed" in x for x in lines)))
            said = next(x for x in lines if "refresh failed" in x)
            self.assertIn("refused (-32000 too many connections; try again later; "
                          "retry after 1 s)", said)
        finally:
            holder.close()
            n.stop()

    def test_a_refresh_to_a_hung_server_ends_within_half_the_lease_left(self) -> None:
        # Granted a 4 s lease, then the server hangs: with call_timeout 5 s the second refresh
        # would wait past the lease; bounded by half the lease left, the client asks again
        # (the next address, in a real tree) well before the lease runs out.
        times: list[float] = []

        def answer(req):  # type: ignore[no-untyped-def]
            times.append(time.monotonic())
            if len(times) > 1:
                return None  # hung from the second request on
            return {"jsonrpc": "2.0", "id": req["id"], "result": {
                "resources": [{"resource_id": "api", "gets": {
                    "capacity": 5, "expires_in": 4, "refresh_interval": 1}}],
                "mastership": {"is_master": True}}}

        hung = FakeServer(answer)
        try:
            with doorman.Client(hung.address, call_timeout=5, minimum_refresh_interval=0.1) as c:
                c.rate("api", wants=5)
                self.assertTrue(eventually(lambda: len(times) >= 3, timeout=6))
            self.assertLess(times[2] - times[0], 4)  # asked twice more within the lease
        finally:
            hung.close()

    def test_close_is_bounded_when_the_server_hangs(self) -> None:
        hung = FakeServer(lambda req: None)  # accepts, never answers
        try:
            c = doorman.Client(hung.address, release_timeout=0.3, call_timeout=5)
            c.rate("api", wants=1)
            self.assertTrue(eventually(lambda: len(hung.requests) >= 1))
            # The refresh in flight is cut short, then the release waits release_timeout.
            start = time.monotonic()
            c.close()
            self.assertLess(time.monotonic() - start, 0.3 + 0.5)
            # The cut refresh does not stop the release: it is sent, on a new connection.
            self.assertIn("release_capacity", [r["method"] for r in hung.requests])
        finally:
            hung.close()

    def test_hostile_answers_never_stop_the_refresh_loop(self) -> None:
        # Each of these once killed the client's thread: it never asked again and close()
        # released nothing. Now each is a failed call; the next answer is adopted.
        def line(req_id: int, result: str) -> bytes:
            return b'{"jsonrpc":"2.0","id":%d,"result":%s}\n' % (req_id, result.encode())

        grant = ('{"mastership":{"is_master":true},"resources":[{"resource_id":"api",'
                 '"gets":{"capacity":%s,"expires_in":%s,"refresh_interval":%s}}]}')
        hostile = [
            lambda i: line(i, '{"resources":' + "[" * 100000 + "]" * 100000 + "}"),
            lambda i: line(i, grant % ("1" + "0" * 400, "10", "1")),
            lambda i: line(i, grant % ("5", "1" + "0" * 400, "1")),
            lambda i: line(i, grant % ("5", "10", "1" + "0" * 400)),
            lambda i: line(i, '{"mastership":{"is_master":false,"master":"not an address"}}'),
            lambda i: line(i, '{"mastership":{"is_master":false,"master":"%s:7700"}}'
                           % ("\u00e9" * 300)),
        ]
        calls = []

        def answer(req):  # type: ignore[no-untyped-def]
            if req["method"] != "get_capacity":
                return {"result": {"mastership": {"is_master": True}}}
            calls.append(req)
            if len(calls) <= len(hostile):
                return hostile[len(calls) - 1](req["id"])
            return line(req["id"], grant % ("5", "10", "1"))

        server = FakeServer(answer)
        try:
            log: list[str] = []
            c = fast(server.address, call_timeout=1, log=log.append)
            api = c.rate("api", wants=5)
            self.assertTrue(eventually(lambda: api.capacity == 5, 30), log)
            self.assertGreater(len(calls), len(hostile))
            c.close()
            self.assertIn("release_capacity", [r["method"] for r in server.requests])
        finally:
            server.close()

    def test_close_is_bounded_when_the_server_trickles_bytes(self) -> None:
        # The release is answered with bytes and never a newline, more often than any read
        # times out: only the call's deadline ends it.
        dripping: list[object] = []

        def answer(req):  # type: ignore[no-untyped-def]
            if req["method"] == "release_capacity":
                dripping.append(req)
                return None
            return {"result": {"mastership": {"is_master": True}, "resources": [
                {"resource_id": "api",
                 "gets": {"capacity": 1, "expires_in": 10, "refresh_interval": 5}}]}}

        server = FakeServer(answer)
        stop = threading.Event()

        def drip() -> None:
            while not stop.wait(0.0005):
                if dripping:
                    for conn in list(server._conns):
                        try:
                            conn.sendall(b" " * 100)
                        except OSError:
                            pass

        threading.Thread(target=drip, daemon=True).start()
        try:
            c = doorman.Client(server.address, release_timeout=0.3, call_timeout=1)
            api = c.rate("api", wants=1)
            self.assertTrue(eventually(lambda: api.leased))
            start = time.monotonic()
            c.close()
            self.assertLess(time.monotonic() - start, 0.3 + 0.5)
            self.assertEqual(len(dripping), 1)
        finally:
            stop.set()
            server.close()

    def test_close_ends_waits(self) -> None:
        n = self.node(config(0))  # nothing to grant: waits block
        c = fast(n.address)
        api = c.rate("api", wants=1, mode="pessimistic")
        errors: list[BaseException] = []

        def waiter() -> None:
            try:
                api.wait()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)  # the waiter is blocked by then (nothing to grant)
        c.close()
        t.join(2)
        self.assertFalse(t.is_alive())
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], doorman.ClientClosed)

    def test_the_example_of_docs_python_md(self) -> None:
        docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
        with open(docs) as f:
            text = f.read()
        # The node as the docs start it: their configuration, and their flags.
        shown = text.split("cat > try.json <<'EOF'\n", 1)[1]
        command = "build/tools/examples/doorman-node --listen 127.0.0.1:7700 --config try.json"
        self.assertIn(command, shown)
        # Its flags after the configuration (the state file, in a directory of the test's own):
        # a root that never granted grants at once, with learning mode at its default.
        flags = shown.split(command, 1)[1].split("\n", 1)[0].split()
        self.assertIn("--state-file", flags)
        flags = [os.path.join(self.nodes_dir(), f) if f.endswith(".json") else f for f in flags]
        n = self.node(json.loads(shown.split("\nEOF\n", 1)[0]), *flags)
        code = text.split("```python\n", 1)[1].split("```", 1)[0]
        self.assertIn('"127.0.0.1:7700"', code)
        code = code.replace("127.0.0.1:7700", n.address)
        out = io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(out):
            exec(compile(code, docs, "exec"), {})  # noqa: S102: the docs' own example
        self.assertLess(time.monotonic() - started, 3)  # its first refresh admits
        self.assertIn("admitted", out.getvalue())  # wait() blocks until the permit is due
        self.assertIn("one of at most 2 jobs in flight", out.getvalue())
        self.assertEqual(n.leases("api"), {})
        self.assertEqual(n.leases("jobs"), {})

    def test_the_budget_of_docs_budgets_md_allots_at_once(self) -> None:
        docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "budgets.md")
        with open(docs) as f:
            text = f.read()
        # The docs' first configuration (its comments dropped) and their root's flags.
        shown = text.split("```json\n", 1)[1].split("```", 1)[0]
        conf = json.loads("\n".join(l for l in shown.splitlines() if not l.strip().startswith("//")))
        command = "doorman-node --listen 127.0.0.1:7700 --config budgets.json"
        self.assertIn(command, text)
        flags = text.split(command, 1)[1].split("\n", 1)[0].split()
        self.assertIn("--state-file", flags)
        flags = [os.path.join(self.nodes_dir(), f) if f.endswith(".json") else f for f in flags]
        n = self.node(conf, *flags)
        rid = conf["resources"][0]["identifier_glob"]
        refresh = conf["resources"][0]["algorithm"]["refresh_interval"]
        started = time.monotonic()
        with doorman.Client(n.address) as c:
            tokens = c.budget(rid, wants=1000)
            tokens.wait(100, timeout=refresh)  # admitted within the first refresh interval
            # The first answer (before the root stored its mark) asked it back in 2 s, not 16.
            self.assertLess(time.monotonic() - started, refresh / 2)
            self.assertFalse(n.call("status", {"resource_id": rid})["result"]["resources"][0]
                             ["learning"])

    def test_bad_arguments_name_the_field(self) -> None:
        with self.assertRaisesRegex(ValueError, "addresses"):
            doorman.Client([])
        with self.assertRaisesRegex(ValueError, "expected host:port"):
            doorman.Client("nope")
        with doorman.Client(free_port_refusing()) as c:
            with self.assertRaisesRegex(ValueError, "mode: must be one of"):
                c.rate("x", mode="sometimes")
            with self.assertRaisesRegex(ValueError, "resource_id: must be a string of 1 to 256"):
                c.rate("")
            with self.assertRaisesRegex(ValueError, "burst: only for a rate resource"):
                c.gauge("g", burst=5)
            with self.assertRaises(TypeError):
                c.rate("x", wantz=5)  # an unknown option
            c.rate("x")
            with self.assertRaisesRegex(ValueError, "already a rate resource"):
                c.gauge("x")


if __name__ == "__main__":
    unittest.main()
