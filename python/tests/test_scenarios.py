"""The client behaviours of tests/client_scenarios.json, which the C++ client's tests run too
(tests/scenario_test.cpp): the same steps against real doorman-node processes, so that the two
clients cannot drift apart."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import unittest
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

import doorman  # noqa: E402
from support import ClosingServer, FakeServer, Node, config, eventually  # noqa: E402

SCENARIOS = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "client_scenarios.json")


class Run:
    """One scenario's world: its node, clients and resources."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        n = scenario.get("node", {})
        self.node = Node(config(n.get("capacity", 100), n.get("lease_length", 5),
                                n.get("refresh_interval", 1), n.get("safe_capacity")))
        self.clients: dict[str, doorman.Client] = {}
        self.resources: dict[tuple[str, str], doorman.RateResource] = {}
        self.closing: ClosingServer | None = None
        self.follower: FakeServer | None = None

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self.node.stop()
        if self.closing:
            self.closing.close()
        if self.follower:
            self.follower.close()

    def step(self, t: unittest.TestCase, s: dict[str, Any]) -> None:
        if "rate" in s:
            opts = {k: s[k] for k in ("wants", "mode") if k in s}
            self.resources[(s["client"], s["rate"])] = self.clients[s["client"]].rate(
                s["rate"], **opts)
        elif "expect" in s:
            e = s["expect"]
            r = self.resources[(e["client"], e["resource"])]
            if "capacity" in e:
                ok = eventually(lambda: r.capacity == e["capacity"], s["within"])
            elif "capacity_above" in e:
                ok = eventually(lambda: r.capacity > e["capacity_above"], s["within"])
            else:
                ok = eventually(lambda: r.leased == e["leased"], s["within"])
            t.assertTrue(ok, f"{e}: capacity {r.capacity}, leased {r.leased}")
        elif "try_acquire" in s:
            a = s["try_acquire"]
            got = self.resources[(a["client"], a["resource"])].try_acquire(a.get("n", 1))
            t.assertEqual(bool(got), s["admitted"])
            if s.get("retry_after_infinite"):
                t.assertEqual(got.retry_after, math.inf)
            if "retry_after_at_most" in s:
                t.assertLessEqual(got.retry_after, s["retry_after_at_most"])
                t.assertGreater(got.retry_after, 0)
        elif "stop" in s:
            self.clients[s["stop"]].close()  # its handles stay: they must admit nothing now
        elif "stop_node" in s:
            self.node.stop()
        elif "close" in s:
            c = self.clients[s["close"]]
            start = time.monotonic()
            c.close()
            t.assertLess(time.monotonic() - start, c.release_timeout + 0.5)
        elif "node_leases" in s:
            n = s["node_leases"]
            t.assertEqual(len(self.node.leases(n["resource"])), n["count"])
        elif "closing_server" in s:
            self.closing = ClosingServer()
        elif "connections_below" in s:
            assert self.closing is not None
            time.sleep(s["during"])  # the measured span: what that much refusal costs
            t.assertLess(self.closing.accepted, s["connections_below"])
            t.assertGreater(self.closing.accepted, 0)
        elif "redirecting_server" in s:
            master = self.node.address
            self.follower = FakeServer(lambda req: {"result": {
                "mastership": {"is_master": False, "master": master}, "resources": []}})
        elif "client" in s:
            servers = {"closing_server": self.closing, "redirecting_server": self.follower}
            server = servers.get(s.get("to", ""))
            to = server.address if server is not None else self.node.address
            self.clients[s["client"]] = doorman.Client(to, **s.get("options", {}))
        else:
            raise ValueError(f"unknown step {s}")


class ScenarioTest(unittest.TestCase):
    def test_every_scenario(self) -> None:
        with open(SCENARIOS) as f:
            scenarios = json.load(f)["scenarios"]
        self.assertGreaterEqual(len(scenarios), 7)
        for sc in scenarios:
            with self.subTest(sc["name"]):
                run = Run(sc)
                try:
                    for i, s in enumerate(sc["steps"]):
                        with self.subTest(step=i):
                            run.step(self, s)
                finally:
                    run.close()


if __name__ == "__main__":
    unittest.main()
