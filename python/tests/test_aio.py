"""The asyncio form against real doorman-node processes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

import doorman  # noqa: E402
import doorman.aio  # noqa: E402
from support import Node, budget_config, config, docs_example, run_docs_example  # noqa: E402


async def until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Whether `predicate()` holds before `timeout` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)  # polling period
    return bool(predicate())


def client(address: str) -> doorman.aio.Client:
    return doorman.aio.Client(address, minimum_refresh_interval=0.1, sample_interval=0.2,
                              demand_window=1.0)


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self) -> None:
        self.node = Node(config(100))

    def tearDown(self) -> None:
        self.node.stop()

    async def test_wait_and_slots(self) -> None:
        async with client(self.node.address) as c:
            api = c.rate("api")  # measured: the first wait makes the fast start
            await asyncio.wait_for(api.wait(), 5)
            jobs = c.gauge("jobs", wants=1)
            self.assertTrue(await until(lambda: jobs.capacity == 1))
            async with jobs.acquire():
                self.assertEqual(jobs.in_use, 1)
                with self.assertRaises(TimeoutError):
                    async with jobs.acquire(timeout=0.1):
                        pass
            self.assertEqual(jobs.in_use, 0)
        self.assertEqual(self.node.leases("api"), {})

    async def test_a_budget_wait_takes_units_and_a_cancelled_one_takes_none(self) -> None:
        n = Node(budget_config(1000))
        try:
            async with client(n.address) as c:
                t = c.budget("tokens", wants=100)
                await asyncio.wait_for(t.wait(60), 10)  # once the first allotment comes
                self.assertEqual(t.spent, 60)
                never = asyncio.ensure_future(t.wait(5000))  # past the whole budget
                await asyncio.sleep(0.1)
                never.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await never
                self.assertEqual(t.spent, 60)  # nothing taken
                with self.assertRaises(TimeoutError):
                    await t.wait(5000, timeout=0.2)
        finally:
            n.stop()

    async def test_a_cancelled_wait_gives_its_reservation_back(self) -> None:
        async with client(self.node.address) as c:
            api = c.rate("api", wants=1)  # 1 a second, a burst of 1
            self.assertTrue(await until(lambda: api.capacity == 1))
            self.assertTrue(api.try_acquire())  # the next permit is due in 1 s
            task = asyncio.ensure_future(api.wait())
            await asyncio.sleep(0.1)  # the wait has reserved the next permit by then
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            # Still the one due in about 1 s (2 s away, had the cancelled wait kept it).
            nxt = api.try_acquire()
            self.assertFalse(nxt)
            self.assertLess(nxt.retry_after, 1.5)

    async def test_a_cancelled_acquire_takes_no_slot(self) -> None:
        async with client(self.node.address) as c:
            jobs = c.gauge("jobs", wants=1)
            self.assertTrue(await until(lambda: jobs.capacity == 1))
            async with jobs.acquire():
                task = asyncio.ensure_future(jobs.acquire().__aenter__())
                await asyncio.sleep(0.1)  # waiting for the only slot by then
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
            self.assertEqual(jobs.in_use, 0)
            self.assertTrue(jobs.try_acquire())

    async def test_a_waiter_is_woken_when_a_slot_is_given_back(self) -> None:
        async with client(self.node.address) as c:
            jobs = c.gauge("jobs", wants=1)
            self.assertTrue(await until(lambda: jobs.capacity == 1))
            order: list[str] = []

            async def second() -> None:
                async with jobs.acquire():
                    order.append("second")

            async with jobs.acquire():
                task = asyncio.ensure_future(second())
                await asyncio.sleep(0.05)  # the second is waiting by then
                order.append("first done")
            await asyncio.wait_for(task, 1)
            self.assertEqual(order, ["first done", "second"])

    async def test_the_asyncio_example_of_docs_python_md(self) -> None:
        self.assertIn("async def main(address):", docs_example(1))
        scope = run_docs_example(1, {})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            await asyncio.wait_for(scope["main"](self.node.address), 10)  # type: ignore[operator]
        self.assertIn("one of at most 2 jobs in flight", out.getvalue())
        self.assertEqual(self.node.leases("api"), {})

    async def test_aclose_ends_waits(self) -> None:
        c = client(self.node.address)
        api = c.rate("none", wants=1, mode="pessimistic", safe_capacity=0)
        # "none" gets 1 of 100; exhaust it, then wait for capacity that a closing client ends.
        self.assertTrue(await until(lambda: api.capacity == 1))
        api.try_acquire()
        task = asyncio.ensure_future(api.wait(5))
        await asyncio.sleep(0.1)  # the wait is sleeping by then
        await c.aclose()
        with self.assertRaises(doorman.ClientClosed):
            await asyncio.wait_for(task, 1)  # at once, not when the 5 permits are due


if __name__ == "__main__":
    unittest.main()
