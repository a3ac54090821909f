"""The asyncio form of the client (docs/python.md): the same client and refresh thread, with
waits that are coroutines. A cancelled wait gives its reservation back; a cancelled acquire
takes no slot.

    async with doorman.aio.Client(["127.0.0.1:7700"]) as client:
        api = client.rate("api")
        await api.wait()
        async with client.gauge("jobs", wants=4).acquire():
            ...
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable, Optional, Sequence, Union

from . import client as _sync

# How long a waiter sleeps at most before it looks again (a wake-up is also sent by the client's
# thread whenever the capacity changes, so this only bounds a lost one).
_LOOK_AGAIN = 0.25


class Client:
    """`doorman.Client`, for asyncio code: the same options."""

    def __init__(self, addresses: Union[str, Sequence[str]], **options: Any) -> None:
        self.sync = _sync.Client(addresses, **options)

    @property
    def client_id(self) -> str:
        return self.sync.client_id

    def rate(self, resource_id: str, **options: Any) -> "RateResource":
        return RateResource(self.sync, self.sync._add(resource_id, "rate", options))

    def gauge(self, resource_id: str, **options: Any) -> "GaugeResource":
        return GaugeResource(self.sync, self.sync._add(resource_id, "gauge", options))

    def budget(self, resource_id: str, **options: Any) -> "BudgetResource":
        return BudgetResource(self.sync, self.sync._add(resource_id, "budget", options))

    async def aclose(self) -> None:
        """`close()` off the event loop: ends every wait, releases within release_timeout."""
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Waiting:
    """An asyncio waiter registered with a resource, woken by the client's thread."""

    def __init__(self, handle: "_sync._Handle") -> None:
        self._client = handle._client
        self._e = handle._e
        self.event = asyncio.Event()
        self._key = (asyncio.get_running_loop(), self.event)

    def __enter__(self) -> "_Waiting":
        with self._client._lock:
            self._e.waiters.add(self._key)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._client._lock:
            self._e.waiters.discard(self._key)

    async def sleep(self, seconds: float, stop: Callable[[], bool]) -> None:
        """`seconds`, or less once `stop()` holds (checked whenever woken)."""
        until = time.monotonic() + seconds
        while not stop():
            left = until - time.monotonic()
            if left <= 0:
                return
            self.event.clear()
            try:
                await asyncio.wait_for(self.event.wait(), left)
            except asyncio.TimeoutError:
                return

    async def changed(self, timeout: Optional[float]) -> None:
        """Until woken, or `timeout` (at most _LOOK_AGAIN) has passed."""
        self.event.clear()
        wait = _LOOK_AGAIN if timeout is None else min(_LOOK_AGAIN, max(0.0, timeout))
        try:
            await asyncio.wait_for(self.event.wait(), wait)
        except asyncio.TimeoutError:
            pass


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


async def _until_taken(h: "_sync._Handle", take: Callable[[], bool], timeout: Optional[float],
                       late: Callable[[], str]) -> None:
    """Tries `take()` each time the resource changes, until it takes (a slot, units):
    ClientClosed once the client closes, TimeoutError(`late()`) after `timeout`. A
    cancellation while it sleeps has taken nothing."""
    client = h._client
    deadline = None if timeout is None else time.monotonic() + timeout
    with _Waiting(h) as waiting:
        while True:
            if client.closed:
                raise _sync.ClientClosed("the client is closed")
            if take():
                return
            left = _left(deadline)
            if left is not None and left <= 0:
                raise TimeoutError(late())
            await waiting.changed(left)


class RateResource(_sync._RateHandle):
    """A rate resource's handle for asyncio: `try_acquire(n)`, `await wait(n)`."""

    async def wait(self, n: float = 1, timeout: Optional[float] = None) -> int:
        """Until `n` permits are due: their slot, for `settle`. TimeoutError after `timeout`
        (nothing consumed); ClientClosed if the client closes first; cancelled, the reservation
        is given back."""
        h = self
        h._check()
        limiter = self._limiter
        client = h._client
        deadline = None if timeout is None else time.monotonic() + timeout
        first = True
        with _Waiting(h) as waiting:
            while True:
                if client.closed:
                    raise _sync.ClientClosed("the client is closed")
                wait, at = limiter.reserve(n, count=first)  # asked for once
                first = False
                if math.isinf(wait):
                    client._held_back(h._e)
                    left = _left(deadline)
                    if left is not None and left <= 0:
                        raise TimeoutError(f"no capacity for {self.id} in time")
                    await waiting.changed(left)
                    continue
                if wait <= 0:
                    return at[1]
                left = _left(deadline)
                if left is not None and wait > left:
                    limiter.cancel(n, at)
                    raise TimeoutError(f"{n} permits of {self.id} not due within the timeout")
                try:
                    await waiting.sleep(wait, lambda: client.closed)
                except asyncio.CancelledError:
                    limiter.cancel(n, at)  # the reservation goes back
                    raise
                if client.closed:
                    limiter.cancel(n, at)
                    raise _sync.ClientClosed("the client is closed")
                return at[1]

class BudgetResource(_sync.BudgetResource):
    """A budget resource's handle for asyncio: `try_acquire(n)`, `settle`, `await wait(n)`."""

    async def wait(self, n: float = 1, timeout: Optional[float] = None) -> None:  # type: ignore[override]
        """Until `n` units are taken. TimeoutError after `timeout`, ClientClosed if the client
        closes first; cancelled, nothing is taken."""
        self._check()
        await _until_taken(self, self._taker(n), timeout, lambda: self._late(n))


class GaugeResource(_sync._GaugeHandle):
    """A gauge resource's handle for asyncio: `async with gauge.acquire(): ...`."""

    def acquire(self, timeout: Optional[float] = None) -> "_Slot":
        """`async with gauge.acquire(): ...` holds one slot for the block."""
        return _Slot(self, timeout)

    async def _take(self, timeout: Optional[float]) -> None:
        self._check()

        def take() -> bool:
            if self._gauge.try_acquire():
                return True
            self._client._held_back(self._e)  # (when the capacity is 0)
            return False

        await _until_taken(self, take, timeout, lambda: f"no slot of {self.id} in time")

    def _give_back(self) -> None:
        self._gauge.release()  # wakes the other waiters


class _Slot:
    def __init__(self, gauge: GaugeResource, timeout: Optional[float]) -> None:
        self._gauge = gauge
        self._timeout = timeout
        self._held = False

    async def __aenter__(self) -> "_Slot":
        await self._gauge._take(self._timeout)
        self._held = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._gauge._give_back()
