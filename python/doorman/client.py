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
import collections
import itertools
import math
import random
import socket
import ssl
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from . import _wire
from ._channel import CallError, Channel
from ._limiters import Acquired, Gauge, RateLimiter

FALLBACKS = ("safe", "optimistic", "pessimistic")
_ids = itertools.count()


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


@dataclass(frozen=True)
class ResourceOptions:
    """What a resource asks for: `wants` (None: measured from use), its `priority`, its fallback
    `mode` (safe, optimistic or pessimistic), a `safe_capacity` overriding the server's, and
    for a rate its `burst` (0: max(1, 0.1 s of the capacity))."""

    wants: Optional[float] = None
    priority: int = 0
    mode: str = "safe"
    safe_capacity: Optional[float] = None
    burst: float = 0.0

    def check(self) -> None:
        """Raises ValueError naming the option that is out of bounds."""
        if self.mode not in FALLBACKS:
            raise ValueError(f"mode: must be one of {', '.join(FALLBACKS)}")
        if self.wants is not None and not 0 <= self.wants <= _wire.MAX_QUANTITY:
            raise ValueError("wants: must be a number between 0 and 1e15")
        if self.safe_capacity is not None and not (
            self.safe_capacity == -1 or 0 <= self.safe_capacity <= _wire.MAX_QUANTITY
        ):
            raise ValueError("safe_capacity: must be between 0 and 1e15, or -1")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError("priority: must be an integer")
        if not 0 <= self.burst <= _wire.MAX_QUANTITY:
            raise ValueError("burst: must be a number between 0 and 1e15")


@dataclass
class _Resource:
    id: str
    kind: str  # "rate" or "gauge"
    fixed_wants: Optional[float]
    priority: int
    mode: str
    safe_capacity: Optional[float]
    limiter: Union[RateLimiter, Gauge]
    handles: int = 1
    lease: Optional[_wire.Lease] = None
    expiry: float = 0.0  # monotonic
    server_safe: Optional[float] = None
    measured: float = 0.0
    held: bool = False  # a caller was held back by capacity 0 (the fast start is due)
    started: bool = False  # the fast start was made
    peak: float = 0.0  # gauge: most in flight + waiting since the last sample
    throttled: bool = False  # a caller was delayed since the last sample
    samples: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)
    # asyncio waiters to wake when the capacity changes or a slot is given back
    async_waiters: set[tuple[Any, Any]] = field(default_factory=set)

    def wants(self) -> float:
        return self.fixed_wants if self.fixed_wants is not None else self.measured

    def capacity(self, now: float) -> float:
        if self.lease is not None and now < self.expiry:
            return self.lease.capacity
        if self.mode == "pessimistic":
            return 0.0
        if self.mode == "optimistic":
            return self.wants()
        if self.safe_capacity is not None:
            return self.safe_capacity
        return self.server_safe if self.server_safe is not None else 0.0


class Client:
    """A client of one doorman tree position (`addresses`: each of its tasks, `host:port`)."""

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
        self.minimum_refresh_interval = float(minimum_refresh_interval)
        self.sample_interval = float(sample_interval)
        self.demand_window = float(demand_window)
        self.throttled_headroom = float(throttled_headroom)
        self._log = log
        self._channel = Channel(addresses, ssl_context=ssl_context, server_name=server_name, log=log)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # capacities changed, or work to do
        self._closed = threading.Event()
        self._resources: dict[str, _Resource] = {}
        self._released: list[str] = []  # resources whose last handle went
        self._ask_now = False
        self._next_refresh = 0.0
        self._last_sent = -math.inf
        self._last_interval = 5.0  # the shortest refresh interval of the last answer
        self._failures = 0
        self._in_refresh = False  # a refresh call is in flight (close() cuts it short)
        self._rng = random.Random()
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

    def _add(self, rid: str, kind: str, options: dict[str, Any]) -> _Resource:
        """The state of resource `rid` (new, or shared with the other handles to it)."""
        _wire.check_id(rid, "resource_id")
        o = ResourceOptions(**options)
        o.check()
        if o.burst and kind != "rate":
            raise ValueError("burst: only for a rate resource")
        with self._lock:
            if self._closed.is_set():
                raise ClientClosed("the client is closed")
            known = self._resources.get(rid)
            if known is not None:
                if known.kind != kind:
                    raise ValueError(f"resource_id: {rid!r} is already a {known.kind} resource")
                known.handles += 1
                return known
            limiter: Union[RateLimiter, Gauge] = (
                RateLimiter(0.0, o.burst) if kind == "rate" else Gauge(0.0)
            )
            r = _Resource(rid, kind, o.wants, o.priority, o.mode, o.safe_capacity, limiter)
            if isinstance(limiter, Gauge):
                limiter.on_release = lambda: self._wake_async_locked(r)
            if rid in self._released:
                self._released.remove(rid)
            self._resources[rid] = r
            self._apply(r, time.monotonic())
            self._ask_now = True  # a new resource is asked for at once (past the floor)
            self._changed.notify_all()
            return r

    def _drop(self, r: _Resource) -> None:
        with self._lock:
            r.handles -= 1
            if r.handles > 0 or self._resources.get(r.id) is not r:
                return
            del self._resources[r.id]
            self._released.append(r.id)
            self._changed.notify_all()
        if isinstance(r.limiter, Gauge):
            r.limiter.wake_all()

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
            for r in self._resources.values():
                r.limiter.close()  # closed is closed: no handle admits from now on
            if self._in_refresh:
                self._channel.interrupt()  # a hung or gone server is not waited for
            self._changed.notify_all()
            gauges = [r.limiter for r in self._resources.values() if isinstance(r.limiter, Gauge)]
        for g in gauges:
            g.wake_all()
        with self._lock:
            for r in self._resources.values():
                self._wake_async(r)
        if threading.current_thread() is not self._thread:
            self._thread.join()
        _live.discard(self)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the refresh loop (the client's thread) --------------------------------------------

    def _run(self) -> None:
        next_sample = time.monotonic() + self.sample_interval
        while not self._closed.is_set():
            now = time.monotonic()
            if now >= next_sample:
                self._sample(now)
                next_sample = now + self.sample_interval
            released = self._take_released()
            if released:
                self._release(released, time.monotonic() + self.release_timeout)
            if self._due(time.monotonic()):
                try:
                    self._refresh()
                except Exception as e:  # a defect, not the server's fault: told, and retried
                    self._failed(time.monotonic(), f"unexpected {type(e).__name__}: {e}")
            with self._lock:
                now = time.monotonic()
                for r in self._resources.values():
                    self._apply(r, now)
                wake = min([next_sample, self._due_at()] + self._expiries(now))
                if not self._closed.is_set() and not self._released:
                    self._changed.wait(max(0.0, wake - now))
        with self._lock:
            ids = list(self._resources) + self._released
            self._released = []
        if ids:
            self._channel.resume()  # a refresh cut short by close() does not stop the release
            self._release(ids, time.monotonic() + self.release_timeout)
        self._channel.close()

    def _take_released(self) -> list[str]:
        with self._lock:
            out, self._released = self._released, []
            return out

    def _expiries(self, now: float) -> list[float]:
        return [r.expiry for r in self._resources.values() if r.lease and r.expiry > now]

    def _due_at(self) -> float:
        """When the next refresh goes out (the lock held): a new resource or a fast start is
        asked for past the floor (a fast start at once), else at the refresh time."""
        if not self._resources:
            return math.inf
        if self._ask_now and self._failures == 0:
            floor = 0.0 if self._fast_start_pending() else self.minimum_refresh_interval
            return min(self._next_refresh, self._last_sent + floor)
        return self._next_refresh

    def _due(self, now: float) -> bool:
        with self._lock:
            return now >= self._due_at()

    def _fast_start_pending(self) -> bool:
        return any(r.started and (r.lease is None or r.lease.capacity == 0) for r in self._resources.values())

    def _refresh(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._in_refresh = True
            self._channel.resume()
            self._ask_now = False
            items = []
            for r in self._resources.values():
                item: dict[str, Any] = {
                    "resource_id": r.id,
                    "priority": r.priority,
                    "wants": min(r.wants(), _wire.MAX_QUANTITY),
                }
                now = time.monotonic()
                if r.lease is not None and now < r.expiry:
                    item["has"] = {
                        "capacity": r.lease.capacity,
                        "expires_in": r.expiry - now,
                        "refresh_interval": r.lease.refresh_interval,
                    }
                items.append(item)
            sent = time.monotonic()
            timeout = self._call_timeout(sent)
        self._last_sent = sent
        try:
            result = self._channel.call(
                "get_capacity",
                {"client_id": self.client_id, "resources": items},
                sent + timeout,
            )
        except CallError as e:
            self._failed(sent, str(e))
            return
        finally:
            with self._lock:
                self._in_refresh = False
        grants, problems = _wire.read_grants(result, {i["resource_id"] for i in items})
        if problems and self._log:
            self._log(
                f"warning: server's answer: {len(problems)} of {len(problems) + len(grants)} "
                f"grants ignored (first: {problems[0]})"
            )
        with self._lock:
            self._failures = 0
            interval = math.inf
            for g in grants:
                held = self._resources.get(g.resource_id)
                if held is None:
                    continue
                r = held
                r.lease = g.lease
                r.expiry = sent + g.lease.expires_in
                if g.safe_capacity is not None:
                    r.server_safe = g.safe_capacity
                interval = min(interval, g.lease.refresh_interval)
                self._apply(r, time.monotonic())
            if math.isinf(interval):
                interval = self._last_interval
            self._last_interval = interval
            soonest_expiry = min([sent + g.lease.expires_in for g in grants] or [math.inf])
            self._next_refresh = max(
                sent + self.minimum_refresh_interval,
                min(sent + interval, soonest_expiry),
            )
            # Resources held back before this answer: their start wants are known now.
            for r in self._resources.values():
                if r.held and not r.started and r.server_safe is not None:
                    self._start(r)
            self._changed.notify_all()

    def _call_timeout(self, now: float) -> float:
        """The refresh call's timeout: call_timeout, but at most half the time the earliest
        lease held has left (never under 0.25 s), so that a hung server is left while there is
        time to ask the next address (as the C++ client's refresh_schedule::call_timeout)."""
        expiries = self._expiries(now)
        if not expiries:
            return self.call_timeout
        return min(self.call_timeout, max(0.25, (min(expiries) - now) / 2))

    def _failed(self, sent: float, why: str) -> None:
        """Backs off: 0.5 s × 2^n, at most 15 s, jittered in [1/2, 1]; but within half the time
        a lease has left, and never later than the last refresh interval."""
        with self._lock:
            self._failures += 1
            delay = min(15.0, 0.5 * 2 ** min(self._failures - 1, 10)) * self._rng.uniform(0.5, 1)
            now = time.monotonic()
            expiries = self._expiries(now)
            if expiries:
                delay = min(delay, max(0.05, (min(expiries) - now) / 2))
            delay = min(delay, self._last_interval)
            self._next_refresh = now + delay
        if self._log:
            self._log(f"warning: refresh failed ({why}); next try in {delay:.2f} s")

    def _release(self, ids: list[str], deadline: float) -> None:
        try:
            self._channel.call(
                "release_capacity", {"client_id": self.client_id, "resources": ids}, deadline
            )
        except CallError as e:
            if self._log:
                self._log(f"warning: release of {len(ids)} resources failed: {e}")

    # ---- capacities and demand ---------------------------------------------------------------

    def _apply(self, r: _Resource, now: float) -> None:
        """The limiter enforces the lease, or the fallback once it ran out."""
        c = r.capacity(now)
        if r.limiter.capacity != c:
            r.limiter.set_capacity(c)
            self._changed.notify_all()
            self._wake_async(r)

    def _wake_async_locked(self, r: _Resource) -> None:
        with self._lock:
            self._wake_async(r)

    def _wake_async(self, r: _Resource) -> None:
        """Wakes the asyncio waiters of `r` (each on its own loop's thread)."""
        for loop, event in list(r.async_waiters):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed
                r.async_waiters.discard((loop, event))

    def _sample(self, now: float) -> None:
        with self._lock:
            for r in self._resources.values():
                if r.fixed_wants is not None:
                    continue
                c = r.capacity(now)
                if isinstance(r.limiter, RateLimiter):
                    value = r.limiter.take_asked() / self.sample_interval
                    if r.throttled:
                        value = max(value, max(c, 1.0) * self.throttled_headroom)
                else:
                    value = math.ceil(r.peak)
                    assert isinstance(r.limiter, Gauge)
                    r.peak = r.limiter.in_use + r.limiter.waiting
                r.samples.append((now, value))
                while r.samples and r.samples[0][0] <= now - self.demand_window:
                    r.samples.popleft()
                mean = sum(v for _, v in r.samples) / len(r.samples)
                measured = max(mean, value) if r.throttled else mean
                if r.started and (r.lease is None or r.lease.capacity == 0):
                    measured = max(measured, r.measured)  # the start wants until capacity comes
                r.measured = min(measured, _wire.MAX_QUANTITY)
                r.throttled = False

    def _held_back(self, r: _Resource) -> None:
        """A caller was held back by capacity 0: the fast start, once per resource, with the
        server's safe capacity as the start wants; before the server's first answer (which
        tells it), the start waits for that answer (as the C++ client_state's `start`)."""
        with self._lock:
            if r.fixed_wants is not None or r.started or self._closed.is_set():
                return
            r.held = True
            if r.server_safe is not None:
                self._start(r)

    def _start(self, r: _Resource) -> None:
        """The fast start (the lock held): wants rise to the start wants, asked for at once."""
        safe = r.server_safe
        r.started = True
        r.measured = max(r.measured, min(safe, _wire.MAX_QUANTITY) if safe and safe >= 1 else 1.0)
        self._ask_now = True
        self._changed.notify_all()

    def _note(self, r: _Resource, throttled: bool = False) -> None:
        with self._lock:
            r.throttled = r.throttled or throttled
            if isinstance(r.limiter, Gauge):
                r.peak = max(r.peak, r.limiter.in_use + r.limiter.waiting)

    def _wait_for_change(self, timeout: float) -> None:
        with self._lock:
            if not self._closed.is_set():
                self._changed.wait(timeout)


class _Handle:
    """What both handles share. The last handle of an id to be closed releases it."""

    def __init__(self, client: Client, r: _Resource) -> None:
        self._client = client
        self._r = r
        self._open = True

    @property
    def id(self) -> str:
        return self._r.id

    @property
    def capacity(self) -> float:
        """What this process may use now: permits a second, or slots (-1: unlimited)."""
        return self._r.limiter.capacity

    @property
    def leased(self) -> bool:
        return self._r.lease is not None and time.monotonic() < self._r.expiry

    @property
    def wants(self) -> float:
        return self._r.wants()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._client._drop(self._r)

    def _check(self) -> None:
        if not self._open:
            raise ValueError(f"resource {self.id!r}: this handle is closed")


class _RateHandle(_Handle):
    """What the synchronous and asyncio rate handles share: all but the wait."""

    def __init__(self, client: Client, r: _Resource) -> None:
        super().__init__(client, r)
        assert isinstance(r.limiter, RateLimiter)
        self._limiter: RateLimiter = r.limiter

    def try_acquire(self, n: float = 1) -> Acquired:
        """Admitted now, or refused with the seconds until it could be (`math.inf` while the
        capacity is 0). A refusal counts as demand."""
        if not self._open:
            self._check()
        got = self._limiter.try_acquire(n)
        if not got.admitted and got.retry_after == math.inf:
            self._client._held_back(self._r)
        return got


class RateResource(_RateHandle):
    """A handle to a rate resource: `try_acquire(n)`, `wait(n)`."""

    def wait(self, n: float = 1, timeout: Optional[float] = None) -> None:
        """Blocks until `n` permits are due; TimeoutError after `timeout` seconds (nothing
        consumed), ClientClosed if the client closes first."""
        self._check()
        limiter = self._limiter
        deadline = None if timeout is None else time.monotonic() + timeout
        first = True
        while True:
            if self._client.closed:
                raise ClientClosed("the client is closed")
            wait = limiter.reserve(n, count=first)  # asked for once, however long it waits
            first = False
            if math.isinf(wait):
                self._client._held_back(self._r)
                left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"no capacity for {self.id} in time")
                self._client._wait_for_change(left)
                continue
            if wait <= 0:
                return
            self._client._note(self._r, throttled=True)
            if deadline is not None and time.monotonic() + wait > deadline:
                limiter.cancel(n)
                raise TimeoutError(f"{n} permits of {self.id} not due within the timeout")
            if self._client._closed.wait(wait):
                limiter.cancel(n)
                raise ClientClosed("the client is closed")
            return


class _GaugeHandle(_Handle):
    """What the synchronous and asyncio gauge handles share: all but the acquire."""

    def __init__(self, client: Client, r: _Resource) -> None:
        super().__init__(client, r)
        assert isinstance(r.limiter, Gauge)
        self._gauge: Gauge = r.limiter

    @property
    def in_use(self) -> int:
        return self._gauge.in_use

    def try_acquire(self) -> bool:
        """A slot now (then `release()` it), or False. A refusal counts as demand."""
        self._check()
        g = self._gauge
        ok = g.try_acquire()
        self._client._note(self._r)
        if not ok:
            with self._client._lock:
                self._r.peak = max(self._r.peak, g.in_use + g.waiting + 1)
            if g.capacity == 0:
                self._client._held_back(self._r)
        return ok

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
            if g.capacity == 0:
                self._client._held_back(self._r)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no slot of {self.id} in time")
            self._client._note(self._r)
            if g.acquire(0.25 if left is None else min(0.25, left), self._client._closed):
                self._client._note(self._r)
                return _Slot(g)


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
