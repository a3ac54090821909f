"""The client: one connection and one refresh loop for every resource of a process, on a thread
of its own, behaving as the C++ client does (docs/python.md, docs/client.md).

    client = doorman.Client(["10.0.0.7:7700", "10.0.0.8:7700"])
    api = client.rate("api")              # wants measured from use
    if api.try_acquire():
        call_the_api()
    with client.gauge("jobs", wants=4).acquire():
        run_a_job()
    client.close()                        # releases everything, within release_timeout
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import random
import socket
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence, Union

from . import _wire
from ._channel import CallError, Channel
from ._core import ClientCore, Entry, ResourceOptions, Step
from ._limiters import NO_SLOT, Acquired, BudgetCounter, Gauge, RateLimiter, check_permits

_ids = itertools.count()


def _warn_to_logging(line: str) -> None:
    """What a client without `log=` tells: to the "doorman" logger, at WARNING."""
    logging.getLogger("doorman").warning(line.removeprefix("warning: "))


class ClientClosed(Exception):
    """The client was closed while waiting, or before."""


def tls_context(
    ca_file: Optional[str] = None,
    cert_file: Optional[str] = None,
    key_file: Optional[str] = None,
) -> ssl.SSLContext:
    """A client TLS context: the server's certificate must chain to `ca_file` (else the
    system's CAs); with `cert_file` and `key_file`, this client shows its own (mutual TLS)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file or key_file:
        if not (cert_file and key_file):
            raise ValueError("cert_file and key_file go together")
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class Client:
    """A client of one doorman tree position (`addresses`: each of its tasks, `host:port`).

    Its decisions are the sans-I/O core's (`_core.ClientCore`, the C++ client's step for step);
    this class only moves bytes (the channel) and time (its thread), under one lock."""

    def __init__(
        self,
        addresses: Union[str, Sequence[str]],
        *,
        client_id: Optional[str] = None,
        call_timeout: float = 5.0,
        release_timeout: float = 1.0,
        minimum_refresh_interval: float = 1.0,
        sample_interval: float = 1.0,
        demand_window: float = 10.0,
        throttled_headroom: float = 2.0,
        ssl_context: Optional[ssl.SSLContext] = None,
        server_name: Optional[str] = None,
        log: Optional[Callable[[str], None]] = None,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a for a in addresses.split(",") if a]
        self.client_id = client_id or f"{socket.gethostname()}:{_pid()}:{next(_ids)}"
        _wire.check_id(self.client_id, "client_id")
        for name, v in (
            ("call_timeout", call_timeout),
            ("release_timeout", release_timeout),
            ("sample_interval", sample_interval),
            ("demand_window", demand_window),
        ):
            if not (isinstance(v, (int, float)) and 0 < v <= 3600):
                raise ValueError(f"{name}: must be a number of seconds in (0, 3600]")
        self.call_timeout = float(call_timeout)
        self.release_timeout = float(release_timeout)
        # Without `log`, what the client tells goes to the "doorman" logger, at WARNING (never
        # lost in silence: Python's last-resort handler prints it when nothing is configured);
        # the channel's every failed attempt only to `log` (a refresh that failed is told here).
        self._log = log or _warn_to_logging
        self._channel = Channel(addresses, ssl_context=ssl_context, server_name=server_name, log=log)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # capacities changed, or work to do
        self._closed = threading.Event()
        self._core = ClientCore(
            self.client_id,
            _now(),
            seed=random.getrandbits(64),
            call_timeout=self.call_timeout,
            minimum_refresh_interval=float(minimum_refresh_interval),
            sample_interval=float(sample_interval),
            demand_window=float(demand_window),
            throttled_headroom=float(throttled_headroom),
        )
        self._in_call = False  # a call is in flight (close() cuts it short)
        self._releasing: list[str] = []  # what close() left to release
        self._spends: list[dict[str, Any]] = []  # and the budgets' last reports
        self._thread = threading.Thread(target=self._run, name="doorman-client", daemon=True)
        self._thread.start()
        _live.add(self)

    # ---- resources ---------------------------------------------------------------------

    def rate(self, resource_id: str, **options: Any) -> "RateResource":
        """At most the leased capacity of `resource_id` operations a second. `options` are
        those of `ResourceOptions` (`wants=None`: measured from use)."""
        return RateResource(self, self._add(resource_id, "rate", options))

    def gauge(self, resource_id: str, **options: Any) -> "GaugeResource":
        """At most the leased capacity of `resource_id` in flight at once (`ResourceOptions`,
        without `burst`)."""
        return GaugeResource(self, self._add(resource_id, "gauge", options))

    def budget(self, resource_id: str, **options: Any) -> "BudgetResource":
        """Units of a budget `resource_id` (docs/budgets.md) spent from the allotments the root
        hands out (`ResourceOptions`, without `burst`; `wants` are units to hold)."""
        return BudgetResource(self, self._add(resource_id, "budget", options))

    def _add(self, rid: str, kind: str, options: dict[str, Any]) -> Entry:
        """The entry of resource `rid` (new, or shared with the other handles to it)."""
        _wire.check_id(rid, "resource_id")
        o = ResourceOptions(**options)
        o.check()
        if o.burst and kind != "rate":
            raise ValueError("burst: only for a rate resource")
        with self._lock:
            if self._closed.is_set():
                raise ClientClosed("the client is closed")
            e = self._core.attach(rid, kind, o, _now())
            if e.on_change is None:
                e.on_change = lambda: self._wake(e)
                if isinstance(e.limiter, Gauge):
                    e.limiter.on_release = lambda: self._wake_async_locked(e)
            self._changed.notify_all()  # a new resource is asked for at once (past the floor)
            return e

    def _drop(self, e: Entry) -> None:
        with self._lock:
            if not self._core.detach(e.id):
                return
            self._changed.notify_all()
        if isinstance(e.limiter, Gauge):
            e.limiter.wake_all()

    # ---- stopping ----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Ends every wait (ClientClosed), then releases every resource with one
        `release_capacity`, within `release_timeout` whatever the server does. Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            # Closed is closed: no handle admits now.
            self._releasing, self._spends = self._core.close()
            if self._in_call:
                self._channel.interrupt()  # a hung or gone server is not waited for
            self._changed.notify_all()
            entries = list(self._core.entries.values())
            for e in entries:
                self._wake_async(e)
        for e in entries:
            if isinstance(e.limiter, Gauge):
                e.limiter.wake_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        _live.discard(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the loop (the client's thread): the core's steps, carried out ----------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                step = self._core.step(_now())
                if step.action == "wait":
                    if not self._closed.is_set():
                        self._changed.wait(min(3600.0, max(0.0, (step.at - _now()) / 1e9)))
                    continue
                self._in_call = True
                self._channel.resume()
            try:
                self._call(step)
            except Exception as e:  # a defect, not the server's fault: told, and retried
                with self._lock:
                    self._core.failed(_now())
                self._warn(f"refresh failed (unexpected {type(e).__name__}: {e})")
        ids = self._releasing
        if ids:
            self._channel.resume()  # a call cut short by close() does not stop the release
            self._release(ids, self._spends, time.monotonic() + self.release_timeout)
        self._channel.close()

    def _call(self, step: Step) -> None:
        method = "get_capacity" if step.action == "refresh" else "release_capacity"
        timeout = step.timeout if step.action == "refresh" else self.release_timeout
        try:
            result = self._channel.call(method, step.params, time.monotonic() + timeout)
        except CallError as e:
            with self._lock:
                self._in_call = False
                self._core.failed(_now())
                failures = self._core.state.failures
            if step.action == "release":
                self._warn(f"release of {len(step.params['resources'])} resources failed: {e}")
            elif failures == 1:  # lost, or never reached
                self._warn(f"refresh failed ({e}); retrying, the leases held stay until they expire")
            return
        with self._lock:
            self._in_call = False
            _, problems = self._core.answered(result, _now())
            failures = self._core.state.failures
            total = self._core.state.answer_grants
            notes, self._core.state.notes = self._core.state.notes, []
        for note in notes:
            self._warn(note)
        if step.action == "release" or not problems:
            return
        if failures == 1:  # the answer was not one to use: a failure
            self._warn(f"refresh failed ({problems[0]}); retrying, the leases held stay until "
                       "they expire")
        elif failures == 0:
            self._warn(f"server's answer: {len(problems)} of {total} grants ignored "
                       f"(first: {problems[0]})")

    def _release(self, ids: list[str], spends: list[dict[str, Any]], deadline: float) -> None:
        params: dict[str, Any] = {"client_id": self.client_id, "resources": ids}
        if spends:
            params["spends"] = spends
        try:
            self._channel.call("release_capacity", params, deadline)
        except CallError as e:
            self._warn(f"release of {len(ids)} resources failed: {e}")

    def _warn(self, what: str) -> None:
        self._log(f"warning: {what}")

    # ---- what the handles tell -------------------------------------------------------------

    def _wake(self, e: Entry) -> None:
        """The capacity of `e` changed (the lock held): the waiters look again."""
        self._changed.notify_all()
        self._wake_async(e)

    def _wake_async_locked(self, e: Entry) -> None:
        with self._lock:
            self._wake_async(e)

    def _wake_async(self, e: Entry) -> None:
        """Wakes the asyncio waiters of `e` (each on its own loop's thread)."""
        for loop, event in list(e.waiters):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed
                e.waiters.discard((loop, event))

    def _held_back(self, e: Entry) -> None:
        """A caller was held back by capacity 0: the fast start (the core decides)."""
        with self._lock:
            if self._core.held_back(e.id, _now()):
                self._changed.notify_all()

    def _wait_for_change(self, timeout: float) -> None:
        with self._lock:
            if not self._closed.is_set():
                self._changed.wait(timeout)


class _Handle:
    """What both handles share. The last handle of an id to be closed releases it."""

    def __init__(self, client: Client, e: Entry) -> None:
        self._client = client
        self._e = e
        self._open = True

    @property
    def id(self) -> str:
        return self._e.id

    @property
    def capacity(self) -> float:
        """What this process may use now: permits a second, or slots (-1: unlimited)."""
        return self._e.limiter.capacity

    @property
    def leased(self) -> bool:
        return self._e.leased

    @property
    def wants(self) -> float:
        return self._client._core.wants(self._e.id)

    def record_answers(self, calls: int, overloads: int = 0) -> None:
        """What the protected service answered `calls` calls, `overloads` of them overloaded
        (429 or 503, a `Retry-After`, a latency over its target): sent with the refreshes for a
        capacity the root learns (docs/learned-capacity.md). A second in which more than 0.5 %
        were overloaded cuts what this client admits to what got through, at once, until the
        root's grants come down. Overloads above `calls` count as `calls`. ValueError unless
        both are whole numbers >= 0."""
        for name, v in (("calls", calls), ("overloads", overloads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: must be a whole number >= 0")
        with self._client._lock:
            self._e.answers += calls
            self._e.overloads += min(overloads, calls)

    def record_answer(self, overloaded: bool) -> None:
        """One answer: `record_answers(1, 1 if overloaded else 0)`."""
        self.record_answers(1, 1 if overloaded else 0)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client._drop(self._e)

    def _check(self) -> None:
        if not self._open:
            raise ValueError(f"resource {self.id!r}: this handle is closed")


class _RateHandle(_Handle):
    """What the synchronous and asyncio rate handles share: all but the wait."""

    def __init__(self, client: Client, e: Entry) -> None:
        super().__init__(client, e)
        assert isinstance(e.limiter, RateLimiter)
        self._limiter: RateLimiter = e.limiter

    def try_acquire(self, n: float = 1) -> Acquired:
        """Admitted now, or refused with the seconds until it could be (`math.inf` while the
        capacity is 0). A refusal counts as demand."""
        if not self._open:
            self._check()
        got = self._limiter.try_acquire(n)
        if not got.admitted and got.retry_after == math.inf:
            self._client._held_back(self._e)
        return got

    def settle(self, reserved: float, used: float, slot: int = NO_SLOT) -> bool:
        """Settles a call admitted for `reserved` permits whose real cost, known after it, was
        `used` (tokens, bytes, money): above the reservation the limiter runs into debt,
        admitting nothing more until the rate has repaid it; below, it gives back the part of
        the call's time no later call holds (what of it is still ahead), given the call's
        `slot` (`try_acquire`'s answer's; without it, as after `wait`, nothing is given back).
        The use above the reservation counts as demand. No call to the server.
        ValueError/TypeError naming the argument unless each is a finite number >= 0;
        ValueError once the handle is closed."""
        if not self._open:
            self._check()
        return self._limiter.settle(reserved, used, slot)


class RateResource(_RateHandle):
    """A handle to a rate resource: `try_acquire(n)`, `wait(n)`."""

    def wait(self, n: float = 1, timeout: Optional[float] = None) -> int:
        """Blocks until `n` permits are due; returns their slot, for `settle`. TimeoutError
        after `timeout` seconds (nothing consumed), ClientClosed if the client closes first."""
        self._check()
        limiter = self._limiter
        deadline = None if timeout is None else time.monotonic() + timeout
        first = True
        while True:
            if self._client.closed:
                raise ClientClosed("the client is closed")
            wait, at = limiter.reserve(n, count=first)  # asked for once, however long it waits
            first = False
            if math.isinf(wait):
                self._client._held_back(self._e)
                left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"no capacity for {self.id} in time")
                self._client._wait_for_change(left)
                continue
            if wait <= 0:
                return at[1]
            if deadline is not None and time.monotonic() + wait > deadline:
                limiter.cancel(n, at)
                raise TimeoutError(f"{n} permits of {self.id} not due within the timeout")
            if self._client._closed.wait(wait):
                limiter.cancel(n, at)
                raise ClientClosed("the client is closed")
            return at[1]


class _GaugeHandle(_Handle):
    """What the synchronous and asyncio gauge handles share: all but the acquire."""

    def __init__(self, client: Client, e: Entry) -> None:
        super().__init__(client, e)
        assert isinstance(e.limiter, Gauge)
        self._gauge: Gauge = e.limiter

    @property
    def in_use(self) -> int:
        return self._gauge.in_use

    def try_acquire(self) -> bool:
        """A slot now (then `release()` it), or False. A refusal counts as demand."""
        self._check()
        if self._gauge.try_acquire():
            return True
        self._client._held_back(self._e)  # (when the capacity is 0)
        return False

    def release(self) -> None:
        """Gives back a slot that `try_acquire` took."""
        self._gauge.release()


class GaugeResource(_GaugeHandle):
    """A handle to a gauge resource: at most its capacity held at once."""

    def acquire(self, timeout: Optional[float] = None) -> "_Slot":
        """A slot, held until the `with` block ends: `with jobs.acquire(): ...`."""
        self._check()
        g = self._gauge
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._client.closed:
                raise ClientClosed("the client is closed")
            self._client._held_back(self._e)  # (when the capacity is 0)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no slot of {self.id} in time")
            if g.acquire(0.25 if left is None else min(0.25, left), self._client._closed):
                return _Slot(g)


class BudgetResource(_Handle):
    """A handle to a budget resource (docs/budgets.md): `try_acquire(n)` takes units from the
    allotment, `settle(reserved, used, window)` after a call. No call to the server per
    request."""

    def __init__(self, client: Client, e: Entry) -> None:
        super().__init__(client, e)
        assert isinstance(e.limiter, BudgetCounter)
        self._counter: BudgetCounter = e.limiter

    def try_acquire(self, n: float = 1) -> bool:
        """Takes `n` units if the allotment has them now (all or nothing); refuses without an
        allotment (before the first answer, after the lease ended unrenewed: a budget has no
        fallback), while a debt is unpaid, and once closed. ValueError/TypeError naming `n`
        unless it is a finite number >= 0."""
        if not self._open:
            self._check()
        if self._counter.try_acquire(n):
            return True
        if self._counter.capacity == 0:
            self._client._held_back(self._e)
        return False

    @property
    def window(self) -> int:
        """The window a call admitted now counts in (it changes when the root names a new
        one): read it before `try_acquire` or `wait`, and pass it to `settle`."""
        return self._counter.window

    def settle(self, reserved: float, used: float, window: int) -> bool:
        """A call admitted in `window` for `reserved` units cost `used`: below, the difference
        is back at once, unless the root has named a new window since (the call counted in the
        old one); above, the rest is spent too (past the allotment, a debt the next allotment
        covers first). Raises as `try_acquire`, naming the argument."""
        if not self._open:
            self._check()
        self._counter.settle(reserved, used, window)
        if used < reserved:  # a refund: the waiters look again
            with self._client._lock:
                self._client._wake(self._e)
        return True

    def wait(self, n: float = 1, timeout: Optional[float] = None) -> None:
        """Blocks until `n` units are taken. Units come with the next allotment (each refresh)
        or a refund: a wait may last until the window ends. TimeoutError after `timeout`
        seconds, ClientClosed if the client closes first, each having taken nothing."""
        self._check()
        deadline = None if timeout is None else time.monotonic() + timeout
        take = self._taker(n)
        while True:
            if self._client.closed:
                raise ClientClosed("the client is closed")
            if take():
                return
            left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(self._late(n))
            self._client._wait_for_change(left)

    def _taker(self, n: float) -> Callable[[], bool]:
        """One wait's attempts at `n` units: counted as asked for once; a refusal at capacity 0
        makes the fast start (the sync and asyncio waits share it)."""
        check_permits(n)
        first = [True]

        def take() -> bool:
            c = self._counter
            if c.try_acquire(n) if first[0] else c.try_again(n):
                return True
            first[0] = False
            if c.capacity == 0:
                self._client._held_back(self._e)
            return False

        return take

    def _late(self, n: float) -> str:
        return f"{n} units of {self.id} not allotted within the timeout"

    @property
    def left(self) -> float:
        """What the allotment has left now (0 without one; negative: a debt)."""
        return self._counter.left()

    @property
    def spent(self) -> float:
        """Units this process spent in the root's current window."""
        return self._counter.spent


class _Slot:
    def __init__(self, gauge: Gauge) -> None:
        self._gauge: Optional[Gauge] = gauge

    def release(self) -> None:
        if self._gauge is not None:
            self._gauge.release()
            self._gauge = None

    def __enter__(self) -> "_Slot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_now = time.monotonic_ns  # the core's time: integer nanoseconds


def _pid() -> int:
    import os

    return os.getpid()


# Clients still open when the interpreter exits are closed then, each within its
# release_timeout.
_live: "weakref.WeakSet[Client]" = weakref.WeakSet()


@atexit.register
def _close_live_clients() -> None:
    for c in list(_live):
        c.close()
