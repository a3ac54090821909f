"""The local limiters that enforce a lease: a GCRA rate limiter and a concurrency gauge, each
behind one lock (thread-safe). The rate limiter is the C++ `basic_rate_limiter` step for step:
its state counts integer nanoseconds of the clock it is given (`time.monotonic_ns` unless a test
gives another), so both decide alike to the nanosecond. A capacity of -1 is unlimited."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Callable, NamedTuple, Optional

NEVER = 2**63 - 1  # no time: blocked
_START = -(2**62)  # a tat long past
NO_SLOT = -(2**63)  # a call's slot when it has none: its settle only runs debts


class Acquired(NamedTuple):
    """A `try_acquire` answer: true when admitted; else `retry_after` seconds until it could be
    (`math.inf` while the capacity is 0). An admission's `slot` is its place in the limiter's
    schedule, for `settle` (`NO_SLOT` when unlimited). Immutable: answers are shared."""

    admitted: bool
    retry_after: float = 0.0
    slot: int = NO_SLOT

    def __bool__(self) -> bool:
        return self.admitted


ADMITTED = Acquired(True)  # every admission answers this one
REFUSED_AT_ZERO = Acquired(False, math.inf)  # every refusal while the capacity is 0


def check_permits(n: object, name: str = "n") -> None:
    """ValueError/TypeError naming the argument (`name`) unless `n` is a finite number >= 0
    (what the C++ limiters' `valid_permits` admits)."""
    if not isinstance(n, (int, float)):
        raise TypeError(f"{name}: must be a number of permits, not {type(n).__name__}")
    # An int compares exactly: one past a double's range is refused here, not by an
    # OverflowError where it is first used as a float.
    if not 0 <= n <= sys.float_info.max:
        raise ValueError(f"{name}: must be a finite number >= 0, not {n!r}")


def _ticks(ns: float) -> int:
    """A span in nanoseconds, saturated (`to_ticks`)."""
    return int(min(1e18, max(0.0, ns)))


class _Limiter:
    """What both limiters share: the capacity they enforce now, and closing (once closed, the
    capacity stays 0 whatever is set: a closed client admits nothing)."""

    __slots__ = ("_capacity", "_closed")

    def __init__(self) -> None:
        self._capacity = 0.0
        self._closed = False

    @property
    def capacity(self) -> float:
        return self._capacity


class RateLimiter(_Limiter):
    """At most `capacity` permits a second, with a burst of `burst` (0: max(1, 0.1 s of the
    capacity); at least 1): the generic cell rate algorithm, one theoretical arrival time `tat`.
    A call of n is admitted when max(tat, now) + min(n, burst)·T - now <= burst·T, and moves
    tat by n·T: one above the burst goes once the burst is whole, leaving the limiter in debt.
    It counts the permits asked for (admitted or not) and the waits it delayed, for the demand
    the client measures."""

    __slots__ = ("_lock", "_clock", "_burst_option", "_burst", "_interval", "_step", "_tolerance",
                 "_room1", "_open_or_shut", "_tat", "_refunded", "_reserved_until", "asked",
                 "delayed")

    def __init__(
        self, capacity: float = 0.0, burst: float = 0.0, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._clock = clock
        self._burst_option = burst
        self._burst = 1.0
        self._capacity = 0.0
        self._interval = math.inf  # nanoseconds per permit: 0 unlimited, inf blocked
        self._step = _ticks(math.inf)
        self._tolerance = _ticks(math.inf)  # the burst, in nanoseconds
        self._tat = _START
        self._refunded = 0  # every refund's span, and what a change of rate moved (refund_book)
        self._reserved_until = -(2**63)  # the latest time a reservation is due
        self.asked = 0.0  # permits asked for (admitted or not)
        self.delayed = 0  # waits that were not due at once
        self.set_capacity(capacity)

    def set_capacity(self, capacity: float) -> None:
        """A new lease: the burst follows it unless fixed, then the rate (`client_core::apply`)."""
        self.set_burst(self._burst_option if self._burst_option > 0 else max(1.0, capacity * 0.1))
        self.set_rate(capacity)

    def set_burst(self, burst: float) -> None:
        with self._lock:
            self._burst = max(1.0, burst) if math.isfinite(burst) else 1.0
            self._steps()

    def set_rate(self, rate: float) -> None:
        """Takes effect at once; a debt (tat ahead of now) is kept in permits, not in time."""
        with self._lock:
            if self._closed:
                return
            self._capacity = rate
            interval = math.inf if rate == 0 or rate != rate else 1e9 / rate if rate > 0 else 0.0
            old, self._interval = self._interval, interval
            self._steps()
            if 0 < old < math.inf and 0 < interval < math.inf and old != interval:
                now = self._clock()
                if self._tat > now:
                    # A call open across the change gives nothing back (refund_book::rescale).
                    self._refunded += self._tat - now
                    self._tat = now + _ticks((self._tat - now) * interval / old)

    def _steps(self) -> None:
        self._step = _ticks(self._interval)
        self._tolerance = _ticks(self._burst * self._interval)
        self._room1 = self._tolerance - min(self._step, self._tolerance)
        self._open_or_shut = not 0 < self._interval < math.inf  # unlimited, or capacity 0

    def close(self) -> None:
        """Admits nothing from now on (capacity 0 for good)."""
        with self._lock:
            self._closed = True
            self._capacity = 0.0
            self._interval = math.inf
            self._steps()

    def try_acquire(self, n: float = 1) -> Acquired:
        # Written out (no helper call): this is the hot path; n = 1 needs no check, and its
        # test is precomputed: late = max(tat, now) + min(T, burst·T) - now - burst·T.
        if n != 1:
            check_permits(n)
        with self._lock:
            self.asked += n
            if self._open_or_shut:
                return ADMITTED if self._interval == 0 else REFUSED_AT_ZERO
            now = self._clock()
            tat = self._tat
            if tat < now:
                tat = now
            if n == 1:
                late = tat - now - self._room1
                if late <= 0:
                    tat += self._step
                    self._tat = tat
                    return Acquired(True, 0.0, tat + self._refunded)
            else:
                increment = _ticks(n * self._interval)
                tolerance = self._tolerance
                late = tat + (increment if increment < tolerance else tolerance) - now - tolerance
                if late <= 0:
                    tat += increment
                    self._tat = tat
                    return Acquired(True, 0.0, tat + self._refunded)
        return Acquired(False, late / 1e9)

    def reserve_slot(self, n: float = 1, count: bool = True) -> tuple[int, int]:
        """Takes `n` permits and says when they are due (clock nanoseconds), when `try_acquire`
        would admit them, with the reservation's slot; NEVER while the capacity is 0 (nothing
        taken). `count`: as asked for (the first attempt of a wait)."""
        check_permits(n)
        with self._lock:
            if count:
                self.asked += n
            interval = self._interval
            now = self._clock()
            if interval == 0:
                return now, NO_SLOT
            if interval == math.inf:
                self.delayed += 1
                return NEVER, NO_SLOT
            tolerance = self._tolerance
            increment = self._step if n == 1 else _ticks(n * interval)
            base = max(self._tat, now)
            self._tat = base + increment
            slot = self._tat + self._refunded
            due = base + min(increment, tolerance) - tolerance
            if due > self._reserved_until:
                self._reserved_until = due
            if due > now:
                self.delayed += 1
                return due, slot
            return now, slot

    def reserve_at(self, n: float = 1, count: bool = True) -> int:
        """`reserve_slot`'s due time alone."""
        return self.reserve_slot(n, count)[0]

    def reserve(self, n: float = 1, count: bool = True) -> tuple[float, tuple[int, int]]:
        """`reserve_slot`, as the seconds to wait (`math.inf`: capacity 0) and the reservation
        to give `cancel` (its due time and slot)."""
        at = self.reserve_slot(n, count)
        if at[0] == NEVER:
            return math.inf, at
        return max(0.0, (at[0] - self._clock()) / 1e9), at

    def _give_back(self, slot: int, span: int, now: int) -> None:
        """Gives back up to `span` of the call at `slot`: what of its span is still ahead of now
        (its end moved back by the refunds since it was made), from anywhere in the schedule
        unless a reservation is due after now, then only from its tail (refund_book::give_back).
        Under the lock."""
        end = slot - self._refunded
        if slot == NO_SLOT or span <= 0 or end <= now:
            return
        if self._reserved_until > now and self._tat != end:
            return
        give = min(span, end - now)
        self._tat -= give
        self._refunded += give

    def settle(self, reserved: float, used: float, slot: int = NO_SLOT) -> bool:
        """Settles a call admitted for `reserved` permits (its `slot` from `try_acquire` or
        `reserve_slot`) that turned out to use `used`: above the reservation the limiter runs
        into debt by the difference (nothing more is admitted until the rate has repaid it);
        below, it gives back what of the difference no later call holds (the part of its span
        still ahead of now; only from the schedule's tail while a reservation waits; nothing for
        a call open across a change of capacity, or without a slot). The use above the
        reservation counts as asked for (the demand measured grows by it). The C++
        `rate_limiter::settle`, step for step. Raises ValueError/TypeError naming `reserved` or
        `used` unless each is a finite number >= 0."""
        check_permits(reserved, "reserved")
        check_permits(used, "used")
        with self._lock:
            if used > reserved:
                self.asked += used - reserved
            interval = self._interval
            if not 0 < interval < math.inf or used == reserved:
                return True
            now = self._clock()
            if used > reserved:
                self._tat = max(self._tat, now) + _ticks((used - reserved) * interval)
            else:
                self._give_back(slot, _ticks((reserved - used) * interval), now)
            return True

    def cancel(self, n: float, at: tuple[int, int]) -> bool:
        """Drops a reservation of `n` permits (`reserve`'s due time and slot) while it is still
        ahead (a wait that will not use them): its place goes back when no one reserved after
        it. False once it has come (they count as used)."""
        with self._lock:
            interval = self._interval
            if not 0 < interval < math.inf:
                return False
            now = self._clock()
            if at[0] <= now:
                return False
            self._give_back(at[1], self._step if n == 1 else _ticks(n * interval), now)
            return True


class Gauge(_Limiter):
    """At most `capacity` (rounded down) held at once; -1: unlimited. It keeps the peak of in
    use + waiting (+1 for a refused try) since the last `take_peak`: the demand it measures."""

    def __init__(self, capacity: float = 0.0) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self._capacity = capacity
        self._limit = self._limit_of(capacity)
        self.in_use = 0
        self.waiting = 0
        self.peak = 0
        self.on_release: Optional[Callable[[], None]] = None  # after a slot is given back

    @staticmethod
    def _limit_of(capacity: float) -> int:
        if capacity != capacity:
            return 0
        return -1 if capacity < 0 else math.floor(min(capacity, 1e15))

    def set_capacity(self, capacity: float) -> None:
        with self._cond:
            if self._closed:
                return
            self._capacity = capacity
            self._limit = self._limit_of(capacity)
            self._cond.notify_all()

    def close(self) -> None:
        """Admits nothing from now on (capacity 0 for good); waiters look again."""
        with self._cond:
            self._closed = True
            self._capacity = 0.0
            self._limit = 0
            self._cond.notify_all()

    def _room(self) -> bool:
        return self._limit < 0 or self.in_use < self._limit

    def _note(self, extra: int) -> None:
        self.peak = max(self.peak, self.in_use + self.waiting + extra)

    def take_peak(self) -> int:
        with self._cond:
            peak, self.peak = self.peak, self.in_use + self.waiting
            return peak

    def try_acquire(self) -> bool:
        with self._cond:
            self._note(1)
            if self._room():
                self.in_use += 1
                return True
            return False

    def acquire(self, timeout: float | None, closed: "threading.Event") -> bool:
        """Waits for a slot; False at the timeout or once `closed` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._note(1)
            self.waiting += 1
            try:
                while not self._room():
                    if closed.is_set():
                        return False
                    left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                    if left <= 0:
                        return False
                    self._note(0)
                    self._cond.wait(left)
                if closed.is_set():
                    return False
                self.in_use += 1
                return True
            finally:
                self.waiting -= 1

    def release(self) -> None:
        with self._cond:
            if self.in_use > 0:
                self.in_use -= 1
            self._cond.notify()
        if self.on_release is not None:
            self.on_release()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()


class BudgetCounter:
    """A budget resource's count in the process (docs/budgets.md), the C++ `budget_counter`
    step for step, behind one lock: units spent in the root's window against a ceiling each
    allotment sets (the report it answers plus the units granted), until the lease's end."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._spent = 0.0
        self._ceiling = 0.0
        self._expires = -NEVER  # no allotment
        self._closed = False  # for good: no allotment applies any more
        self._capacity = 0.0  # the lease's (its allotment)
        self._window = 0  # changes when the root names a new window
        self._reported = 0.0  # the driver's last report,
        self._at_report = 0.0  # the spend when it was made,
        self._refunded = 0.0  # and the refunds since
        self.attempted = 0.0  # units asked for (admitted or not, and settled above)
        self.refused = 0

    @property
    def spent(self) -> float:
        return self._spent

    @property
    def capacity(self) -> float:
        """The allotment of the lease in hand (0 without one)."""
        return self._capacity

    def try_acquire(self, n: float = 1) -> bool:
        """Takes `n` units if the allotment has them now (all or nothing). Raises
        ValueError/TypeError naming `n` unless it is a finite number >= 0."""
        check_permits(n)
        with self._lock:
            self.attempted += n
            if self._take(n):
                return True
            self.refused += 1
            return False

    def try_again(self, n: float) -> bool:
        """`try_acquire` for a caller already counted (a waiter): not counted again."""
        with self._lock:
            return self._take(n)

    def _take(self, n: float) -> bool:
        if not self._clock() < self._expires or self._spent + n > self._ceiling:
            return False
        self._spent += n
        return True

    @property
    def window(self) -> int:
        """The window a call admitted now counts in: read it before `try_acquire` and pass it
        to `settle`. It changes when the root names a new window."""
        return self._window

    def settle(self, reserved: float, used: float, window: int) -> bool:
        """A call admitted in `window` for `reserved` units cost `used`: above, the rest is
        spent too (past the ceiling, a debt); below, the difference is back unless the root
        named a new window since (the call counted in the old one). Raises as `try_acquire`."""
        check_permits(reserved, "reserved")
        check_permits(used, "used")
        with self._lock:
            if used > reserved:
                self.attempted += used - reserved
                self._spent += used - reserved
            elif used < reserved and window == self._window:
                self._spent = max(0.0, self._spent - (reserved - used))
                self._refunded += reserved - used
            return True

    def left(self) -> float:
        """What the allotment has left now (0 once it ended; negative: a debt)."""
        with self._lock:
            left = self._ceiling - self._spent
            return left if self._clock() < self._expires else min(0.0, left)

    # The driver's side.

    def report(self) -> float:
        """The spend to report: never less than a report before it."""
        with self._lock:
            self._at_report = self._spent
            self._refunded = 0.0
            self._reported = max(self._reported, self._spent)
            return self._reported

    def grant(self, units: float, spent_at_send: float, new_window: bool, expires: int) -> None:
        """Applies an allotment of `units` answering the report `spent_at_send`, until
        `expires` (the clock's nanoseconds); in a new window the count starts again from what
        was admitted since that report (refunds since then are not taken off it)."""
        with self._lock:
            if self._closed:
                return
            if new_window:
                self._spent = max(0.0, self._spent + self._refunded - self._at_report)
                self._window += 1
                self._reported = self._at_report = self._refunded = 0.0
                self._ceiling = units
            else:
                self._ceiling = spent_at_send + units
            self._expires = expires

    def set_capacity(self, capacity: float) -> None:
        """The lease's capacity: at 0 or below its allotment ended (an allotment itself comes
        with its answer: `grant`)."""
        with self._lock:
            self._capacity = 0.0 if self._closed else capacity
            if not capacity > 0:
                self._expires = -NEVER

    def close(self) -> None:
        """Admits nothing from now on, whatever is granted after (the client closed)."""
        with self._lock:
            self._closed = True
            self._capacity = 0.0
            self._expires = -NEVER
