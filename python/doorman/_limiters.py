"""The local limiters that enforce a lease: a GCRA rate limiter and a concurrency gauge, each
behind one lock (thread-safe), on the monotonic clock. A capacity of -1 is unlimited."""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, NamedTuple, Optional

UNLIMITED = -1.0


class Acquired(NamedTuple):
    """A `try_acquire` answer: true when admitted; else `retry_after` seconds until it could be
    (`math.inf` while the capacity is 0). Immutable: answers are shared."""

    admitted: bool
    retry_after: float = 0.0

    def __bool__(self) -> bool:
        return self.admitted


ADMITTED = Acquired(True)  # every admission answers this one
REFUSED_AT_ZERO = Acquired(False, math.inf)  # every refusal while the capacity is 0
_monotonic = time.monotonic


def check_permits(n: object) -> None:
    """ValueError/TypeError naming `n` unless it is a finite number >= 0 (what the C++
    limiters' `valid_permits` admits)."""
    if not isinstance(n, (int, float)):
        raise TypeError(f"n: must be a number of permits, not {type(n).__name__}")
    if not 0 <= n < math.inf:
        raise ValueError(f"n: must be a finite number >= 0, not {n!r}")


class _Limiter:
    """What both limiters share: the capacity they enforce now, and closing (once closed, the
    capacity stays 0 whatever is set: a closed client admits nothing)."""

    _capacity = 0.0
    _closed = False

    @property
    def capacity(self) -> float:
        return self._capacity


class RateLimiter(_Limiter):
    """At most `capacity` permits a second, with a burst of `burst` (0: max(1, 0.1 s of the
    capacity)): the generic cell rate algorithm, one theoretical arrival time. A call of any
    cost is admitted when due: one above the burst once the burst is whole, leaving the limiter
    in debt (as the C++ limiter does). It also counts the permits asked for (admitted or not),
    for the demand the client measures."""

    def __init__(self, capacity: float = 0.0, burst: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._burst_option = burst
        self._capacity = 0.0
        self._interval = math.inf  # seconds per permit
        self._tolerance = 0.0  # the burst, in seconds
        self._tat = 0.0  # theoretical arrival time of the next permit
        self.asked = 0.0  # permits asked for since `take_asked`
        self.set_capacity(capacity)

    def set_capacity(self, capacity: float) -> None:
        with self._lock:
            if self._closed:
                return
            self._capacity = capacity
            if capacity > 0:
                burst = self._burst_option if self._burst_option > 0 else max(1.0, 0.1 * capacity)
                self._interval = 1.0 / capacity
                self._tolerance = burst * self._interval
                # The next permit no later than a new burst allows.
                self._tat = min(self._tat, time.monotonic() + self._tolerance - self._interval)

    def close(self) -> None:
        """Admits nothing from now on (capacity 0 for good)."""
        with self._lock:
            self._closed = True
            self._capacity = 0.0

    def take_asked(self) -> float:
        with self._lock:
            asked, self.asked = self.asked, 0.0
            return asked

    def try_acquire(self, n: float = 1) -> Acquired:
        # Written out (no helper call): this is the hot path; n = 1 needs no check.
        if n != 1:
            check_permits(n)
        with self._lock:
            self.asked += n
            c = self._capacity
            if c < 0:
                return ADMITTED
            if c == 0:
                return REFUSED_AT_ZERO
            now = _monotonic()
            tat = self._tat if self._tat > now else now
            after = tat + n * self._interval
            allowed_at = after - self._tolerance
            if allowed_at <= now:
                self._tat = after
                return ADMITTED
            if after - tat > self._tolerance:  # above the burst: due once the burst is whole
                if tat <= now:
                    self._tat = after
                    return ADMITTED
                allowed_at = tat
        return Acquired(False, allowed_at - now)

    def reserve(self, n: float = 1, count: bool = True) -> float:
        """Takes `n` permits now and says how long until they are due (`math.inf`: capacity 0,
        nothing taken), when `try_acquire` would admit them. `count`: as asked for (the first
        attempt of a wait)."""
        check_permits(n)
        with self._lock:
            if count:
                self.asked += n
            c = self._capacity
            if c < 0:
                return 0.0
            if c == 0:
                return math.inf
            now = _monotonic()
            tat = self._tat if self._tat > now else now
            span = n * self._interval
            self._tat = tat + span
            return max(0.0, tat + min(span, self._tolerance) - self._tolerance - now)

    def cancel(self, n: float = 1) -> None:
        """Gives back a reservation that was not used."""
        with self._lock:
            if self._capacity > 0:
                self._tat -= n * self._interval


class Gauge(_Limiter):
    """At most `capacity` (rounded down) held at once; -1: unlimited."""

    def __init__(self, capacity: float = 0.0) -> None:
        self._cond = threading.Condition()
        self._capacity = capacity
        self.in_use = 0
        self.waiting = 0
        self.on_release: Optional[Callable[[], None]] = None  # after a slot is given back

    def set_capacity(self, capacity: float) -> None:
        with self._cond:
            if self._closed:
                return
            self._capacity = capacity
            self._cond.notify_all()

    def close(self) -> None:
        """Admits nothing from now on (capacity 0 for good); waiters look again."""
        with self._cond:
            self._closed = True
            self._capacity = 0.0
            self._cond.notify_all()

    def _room(self) -> bool:
        return self._capacity < 0 or self.in_use < math.floor(self._capacity)

    def try_acquire(self) -> bool:
        with self._cond:
            if self._room():
                self.in_use += 1
                return True
            return False

    def acquire(self, timeout: float | None, closed: "threading.Event") -> bool:
        """Waits for a slot; False at the timeout or once `closed` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self.waiting += 1
            try:
                while not self._room():
                    if closed.is_set():
                        return False
                    left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                    if left <= 0:
                        return False
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
