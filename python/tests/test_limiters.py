"""The local limiters on a manual clock: calls of any cost admitted when due, the bound over any
window, bad numbers of permits refused naming `n`, and closed limiters that admit nothing.
The same rules as the C++ limiter's (tests/limit_test.cpp)."""

from __future__ import annotations

import math
import os
import random
import sys
import unittest
from typing import Iterator
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

from doorman._limiters import BudgetCounter, Gauge, RateLimiter  # noqa: E402


class ManualClock:
    """Seconds in `now`; read by a limiter as integer nanoseconds, as its clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> int:
        return round(self.now * 1e9)


@contextmanager
def manual_clock() -> Iterator[ManualClock]:
    yield ManualClock()


class RateLimiterTest(unittest.TestCase):
    def test_a_call_above_the_burst_is_admitted_when_the_burst_is_whole(self) -> None:
        with manual_clock() as clock:
            lim = RateLimiter(10, burst=2, clock=clock)
            self.assertTrue(lim.try_acquire(1))
            early = lim.try_acquire(3)  # the burst is not whole: 0.1 s until it is
            self.assertFalse(early)
            self.assertAlmostEqual(early.retry_after, 0.1)
            clock.now += 0.1
            self.assertTrue(lim.try_acquire(3))  # one permit borrowed
            after = lim.try_acquire(1)
            self.assertAlmostEqual(after.retry_after, 0.2)  # the debt, then one permit
            self.assertAlmostEqual(lim.reserve(1)[0], 0.2)  # a wait is due at the same time

    def test_any_cost_within_rate_times_window_plus_burst_plus_one_call(self) -> None:
        rate = 10.0
        for burst in (1.0, 3.0):
            with manual_clock() as clock, self.subTest(burst=burst):
                lim = RateLimiter(rate, burst=burst, clock=clock)
                rng = random.Random(11)
                admitted: list[tuple[float, float]] = []
                start = clock.now
                largest = 0.0
                while clock.now - start < 60:
                    n = 0.5 + rng.randrange(16) * 0.5
                    largest = max(largest, n)
                    got = lim.try_acquire(n)
                    if not got:
                        self.assertNotEqual(got.retry_after, math.inf)
                        clock.now += got.retry_after * (1 - 1e-9) - 1e-9
                        self.assertFalse(lim.try_acquire(n))
                        clock.now += got.retry_after * 1e-9 + 2e-9
                        self.assertTrue(lim.try_acquire(n))
                    admitted.append((clock.now, n))
                    clock.now += rng.random() * 0.3
                for w in (0.0, 0.1, 1.0, 10.0):
                    for i, (t, _) in enumerate(admitted):
                        total = sum(n for u, n in admitted[i:] if u - t <= w)
                        self.assertLessEqual(total, rate * w + burst + largest + 1e-6)
                self.assertGreaterEqual(sum(n for _, n in admitted), rate * 60 * 0.9)

    def test_settle_runs_into_debt_or_refunds_never_past_whole(self) -> None:
        with manual_clock() as clock:
            lim = RateLimiter(10, burst=2, clock=clock)
            self.assertTrue(lim.try_acquire(2))  # the burst, at an estimate of 2
            self.assertTrue(lim.settle(2, 5))  # it used 5: 3 owed, 0.3 s at 10/s
            self.assertEqual(lim.asked, 5)  # the use above the estimate is demand
            refused = lim.try_acquire(1)
            self.assertAlmostEqual(refused.retry_after, 0.4)  # the debt, then the burst's room
            clock.now += 0.4
            self.assertTrue(lim.try_acquire(1))
            # A refund gives back what was not used, never more than makes it whole.
            idle = RateLimiter(10, burst=2, clock=clock)
            first = idle.try_acquire(2)
            self.assertTrue(idle.settle(2, 0, first.slot))
            second = idle.try_acquire(2)
            self.assertTrue(second)
            self.assertTrue(idle.settle(2, 0, second.slot))
            self.assertTrue(idle.settle(50, 0, second.slot))  # already whole: nothing more
            self.assertTrue(idle.try_acquire(2))
            self.assertFalse(idle.try_acquire(1))
            self.assertTrue(idle.settle(2, 0))  # without its slot: nothing back
            self.assertFalse(idle.try_acquire(1))
            for bad, name in (((-1, 1), "reserved"), ((1, math.inf), "used"), ((1, math.nan), "used")):
                with self.assertRaisesRegex(ValueError, f"^{name}: must be a finite number >= 0"):
                    lim.settle(*bad)
            with self.assertRaisesRegex(TypeError, "^used: must be a number of permits"):
                lim.settle(1, "2")  # type: ignore[arg-type]

    def test_a_refund_gives_back_only_time_no_later_call_holds(self) -> None:
        # rate_limiter's "a refund gives back only time that no later call holds", step for step.
        with manual_clock() as clock:
            # Rate 1/s, burst 1: calls at 0 and 5; the first settles (1, 0) at 5.1: nothing back.
            lim = RateLimiter(1, burst=1, clock=clock)
            a = lim.try_acquire()
            clock.now += 5
            self.assertTrue(lim.try_acquire())
            clock.now += 0.1
            self.assertTrue(lim.settle(1, 0, a.slot))
            self.assertAlmostEqual(lim.try_acquire().retry_after, 0.9)
            # From the middle of the schedule, the part still ahead; a later call's end moved
            # back by the refund before its own.
            lim = RateLimiter(10, burst=10, clock=clock)
            a = lim.try_acquire(5)
            self.assertTrue(lim.try_acquire(3))
            clock.now += 0.1
            self.assertTrue(lim.settle(5, 1, a.slot))
            self.assertTrue(lim.try_acquire(7))
            self.assertFalse(lim.try_acquire(1))
            clock.now += 2
            c1, c2 = lim.try_acquire(5), lim.try_acquire(3)
            clock.now += 0.1
            self.assertTrue(lim.settle(5, 1, c1.slot))
            clock.now += 0.15
            self.assertTrue(lim.try_acquire(1))
            clock.now += 0.05
            self.assertTrue(lim.settle(3, 0, c2.slot))
            self.assertTrue(lim.try_acquire(9))
            self.assertFalse(lim.try_acquire(1))
            # With a reservation waiting, only from the tail.
            lim = RateLimiter(10, burst=1, clock=clock)
            a = lim.try_acquire()
            self.assertAlmostEqual(lim.reserve(1)[0], 0.1)
            self.assertTrue(lim.settle(1, 0, a.slot))
            self.assertAlmostEqual(lim.reserve(1)[0], 0.2)
            # A cancel: its place lost from the middle of the queue, given back from its tail.
            lim = RateLimiter(10, burst=1, clock=clock)
            self.assertTrue(lim.try_acquire())
            _, first = lim.reserve(1)
            lim.reserve(1)
            self.assertTrue(lim.cancel(1, first))
            wait, last = lim.reserve(1)
            self.assertAlmostEqual(wait, 0.3)
            self.assertTrue(lim.cancel(1, last))
            self.assertAlmostEqual(lim.reserve(1)[0], 0.3)
            # A call open across a change of capacity gives nothing back.
            lim = RateLimiter(10, burst=10, clock=clock)
            a = lim.try_acquire(5)
            lim.set_capacity(20)  # (the burst option given stays)
            self.assertTrue(lim.settle(5, 0, a.slot))
            self.assertTrue(lim.try_acquire(5))
            self.assertFalse(lim.try_acquire(1))

    def test_bad_numbers_of_permits_name_n(self) -> None:
        lim = RateLimiter(10)
        # 10**400: an int past a double's range (it raised OverflowError where first used).
        for bad in (-1, math.nan, math.inf, -math.inf, 10**400):
            with self.subTest(bad=bad):
                with self.assertRaisesRegex(ValueError, r"^n: must be a finite number >= 0"):
                    lim.try_acquire(bad)
                with self.assertRaisesRegex(ValueError, r"^n: "):
                    lim.reserve(bad)
        for wrong in ("2", None, [1]):
            with self.subTest(wrong=wrong):
                with self.assertRaisesRegex(TypeError, r"^n: must be a number of permits"):
                    lim.try_acquire(wrong)  # type: ignore[arg-type]
        self.assertEqual(lim.asked, 0)  # never counted as demand

    def test_a_closed_limiter_admits_nothing_whatever_is_set(self) -> None:
        lim = RateLimiter(-1)
        self.assertTrue(lim.try_acquire())
        lim.close()
        lim.set_capacity(100)
        self.assertEqual(lim.capacity, 0)
        got = lim.try_acquire()
        self.assertFalse(got)
        self.assertEqual(got.retry_after, math.inf)
        g = Gauge(-1)
        g.close()
        g.set_capacity(5)
        self.assertFalse(g.try_acquire())



class BudgetCounterTest(unittest.TestCase):
    """The C++ test "a client's budget counter: allotments set a ceiling, settling spends or
    refunds" (tests/budget_test.cpp), step for step."""

    def test_allotments_set_a_ceiling_settling_spends_or_refunds(self) -> None:
        clock = ManualClock()
        b = BudgetCounter(clock)
        self.assertFalse(b.try_acquire(1))  # no allotment: nothing
        b.grant(100, 0, False, clock() + 10**10)
        self.assertTrue(b.try_acquire(60))
        self.assertFalse(b.try_acquire(50))  # 40 left: all or nothing
        with self.assertRaisesRegex(ValueError, "^n: must be a finite number >= 0"):
            b.try_acquire(-1)
        with self.assertRaisesRegex(ValueError, "^n: "):
            b.try_acquire(math.inf)
        self.assertEqual(b.left(), 40)
        w = b.window
        self.assertTrue(b.settle(60, 90, w))  # it cost 30 more: 10 left
        self.assertEqual(b.left(), 10)
        self.assertEqual(b.report(), 90)
        self.assertTrue(b.settle(10, 0, w))  # a refund after the report ...
        self.assertEqual(b.spent, 80)
        self.assertEqual(b.report(), 90)  # ... is not taken back from the root
        with self.assertRaisesRegex(ValueError, "^used: "):
            b.settle(1, math.nan, w)
        self.assertTrue(b.settle(0, 50, w))  # a debt: 30 over
        self.assertEqual(b.left(), -30)
        self.assertFalse(b.try_acquire(0.5))
        b.grant(40, 90, False, clock() + 10**10)  # answering the report of 90: covers the debt
        self.assertEqual(b.left(), 0)
        b.grant(40, 130, False, clock() + 10**10)
        self.assertEqual(b.left(), 40)
        clock.now += 10  # it expires unrenewed
        self.assertFalse(b.try_acquire(1))
        self.assertEqual(b.left(), 0)
        b.grant(40, 100, False, clock() + 10**10)
        self.assertEqual(b.left(), 10)
        # A new window: what was spent since the report it answers (130) counts again.
        self.assertEqual(b.report(), 130)
        b.grant(25, 130, True, clock() + 10**10)
        self.assertEqual(b.spent, 0)
        self.assertEqual(b.report(), 0)
        self.assertEqual(b.left(), 25)
        self.assertEqual(b.refused, 4)  # the refusals above, not the invalid amounts
        b.close()
        b.grant(25, 0, False, clock() + 10**10)  # closed is closed
        self.assertFalse(b.try_acquire(1))

    def test_a_call_open_when_a_new_window_begins_refunds_nothing_into_it(self) -> None:
        """The C++ test "a call open when the root names a new window refunds nothing into it"
        (tests/budget_test.cpp), its first section, step for step."""
        clock = ManualClock()
        b = BudgetCounter(clock)
        b.grant(10, 0, False, clock() + 10**10)
        old = b.window
        self.assertTrue(b.try_acquire(10))  # a call of 10, open
        reported = b.report()
        self.assertEqual(reported, 10)
        b.grant(10, reported, True, clock() + 10**10)
        self.assertNotEqual(b.window, old)
        now = b.window
        self.assertTrue(b.try_acquire(10))  # the new window's 10
        self.assertTrue(b.settle(10, 0, old))  # the old call cost nothing: its window is over
        self.assertEqual(b.spent, 10)
        self.assertFalse(b.try_acquire(10))  # (was admitted: 20 against 10)
        self.assertTrue(b.settle(10, 4, now))  # this window's call gives back what it did not use
        self.assertEqual(b.spent, 4)
        self.assertTrue(b.settle(0, 3, old))  # an old call's debt still counts
        self.assertEqual(b.spent, 7)

    def test_a_refund_between_a_report_and_a_new_window_is_not_taken_off_it(self) -> None:
        """The same C++ test's second section, step for step: a refund between a report and the
        new window's answer is not taken off the new window's count."""
        clock = ManualClock()
        b = BudgetCounter(clock)
        b.grant(20, 0, False, clock() + 10**10)
        w = b.window
        self.assertTrue(b.try_acquire(10))  # call A, open when the report goes out
        reported = b.report()
        self.assertTrue(b.try_acquire(10))  # call B, after the report: the root has not seen it
        self.assertTrue(b.settle(10, 0, w))  # A cost nothing, before the answer
        b.grant(10, reported, True, clock() + 10**10)
        self.assertEqual(b.spent, 10)  # B counts in the new window
        self.assertFalse(b.try_acquire(1))


if __name__ == "__main__":
    unittest.main()
