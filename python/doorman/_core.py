"""The client's decisions, sans I/O: what to ask the server, when, what its answers grant, what
each resource may use, and what it wants. No socket, thread or clock inside: every call is given
the time (`now`, integer nanoseconds of a monotonic clock) and returns what to do. The threaded
client (`client.py`) and the asyncio one (`aio.py`) only move bytes and time.

It is the C++ client's state, step for step: `ClientState` is `doorman::basic_client_state` with
its `refresh_schedule` and `jittered_backoff`; `ClientCore` adds what the C++ `client_core` does
around it (demand sampling, limiter capacities, the fast start). A differential test
(python/tests/test_differential.py) drives both with the same seeded traces and compares every
decision, so the two cannot drift apart.

    core = ClientCore("web-1:42:0", now=monotonic_ns())
    entry = core.attach("api", "rate", ResourceOptions(), now)
    step = core.step(now)             # Step("refresh", params, timeout) / ("release", ids) / ("wait", at)
    core.answered(result, now)        # the server's result (untrusted), or
    core.failed(now)                  # no answer
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Union

from . import _wire
from ._limiters import BudgetCounter, Gauge, RateLimiter

NEVER = 2**63 - 1  # time_point::max(): no time
FALLBACKS = ("safe", "optimistic", "pessimistic")
_MASK = 2**64 - 1


# `learning_options`: the share of calls overloaded above which a client cuts itself, and how
# far below what got through.
OVERLOAD_RATIO = 0.005
MARGIN = 0.03


def to_ns(secs: float) -> int:
    """Seconds as nanoseconds, rounded half away from zero and saturated (`to_duration`)."""
    if secs != secs:
        return 0
    ticks = secs * 1e9
    limit = float(NEVER) / 4
    if ticks >= limit:
        return int(limit)
    if ticks <= -limit:
        return -int(limit)
    return math.floor(ticks + 0.5) if ticks >= 0 else -math.floor(-ticks + 0.5)


def to_s(ns: int) -> float:
    return ns / 1e9


class SplitMix64:
    """The jitter's generator, as the C++ `detail::splitmix64`: the same seed, the same draws."""

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK

    def next(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def uniform(self) -> float:
        return (self.next() >> 11) * 2.0**-53


class Backoff:
    """Attempt n waits uniform in [1/2, 1] of min(15 s, 0.5 s x 2^(n-1))."""

    def __init__(self, seed: int, initial: float = 0.5, maximum: float = 15.0) -> None:
        self._random = SplitMix64(seed)
        self._initial = initial
        self._maximum = maximum

    def delay(self, attempt: int) -> float:
        step = min(self._maximum, self._initial * 2.0 ** (min(max(attempt, 1), 31) - 1))
        return step * (0.5 + 0.5 * self._random.uniform())


class RefreshSchedule:
    """When the next request goes out: the floor between two, the interval of the last answer,
    the backoff after failures within half a lease's time left (`refresh_schedule`)."""

    def __init__(self, minimum_interval: float, idle_interval: float, seed: int) -> None:
        self._floor = minimum_interval
        self._idle = idle_interval
        self._interval = idle_interval
        self._backoff = Backoff(seed)
        self._next = 0
        self.last_request = 0
        self.failures = 0
        self.answered_once = False
        self.in_flight = False

    def next_request(self, news: bool) -> int:
        if news and self.failures == 0:
            return min(self._next, self.last_request + to_ns(self._floor))
        return self._next

    def due(self, now: int, news: bool) -> bool:
        return not self.in_flight and now >= self.next_request(news)

    def sent(self, now: int) -> None:
        self.last_request = now
        self.in_flight = True

    def answered(self, now: int, interval: float) -> str:
        self.in_flight = False
        if not math.isfinite(interval):
            interval = self._idle
        self._interval = max(interval, self._floor)
        self._next = now + to_ns(self._interval)
        event = "reached" if not self.answered_once else "regained" if self.failures else "none"
        self.answered_once = True
        self.failures = 0
        return event

    def failed(self, now: int, earliest_expiry: int) -> str:
        self.in_flight = False
        self.failures += 1
        delay = min(self._backoff.delay(self.failures), self._interval)
        if earliest_expiry > now:
            delay = min(delay, to_s(earliest_expiry - now) / 2)
        self._next = now + to_ns(max(self._floor, delay))
        return "lost" if self.failures == 1 and self.answered_once else "none"

    @staticmethod
    def call_timeout(now: int, earliest_expiry: int, configured: float) -> float:
        if earliest_expiry <= now or earliest_expiry == NEVER:
            return configured
        return min(configured, max(to_s(earliest_expiry - now) / 2, 0.25))

    def expedite(self, now: int) -> None:
        if not self.in_flight and self.failures == 0:
            self._next = min(self._next, now)


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
        if self.wants is not None and not _quantity(self.wants):
            raise ValueError("wants: must be a number between 0 and 1e15")
        if self.safe_capacity is not None and not (
            self.safe_capacity == -1 or _quantity(self.safe_capacity)
        ):
            raise ValueError("safe_capacity: must be between 0 and 1e15, or -1")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError("priority: must be an integer")
        if not _quantity(self.burst):
            raise ValueError("burst: must be a number between 0 and 1e15")


def _quantity(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= _wire.MAX_QUANTITY


@dataclass
class Lease:
    capacity: float
    expiry: int
    refresh_interval: int


@dataclass
class _Held:
    """One resource as the state holds it (`client_resource`)."""

    priority: int
    wants: float
    mode: str
    safe_capacity: Optional[float]
    lease: Optional[Lease] = None
    server_safe: Optional[float] = None
    held_back: bool = False
    fast_started: bool = False
    budget: bool = False  # a budget resource: it reports its spend, and has no fallback
    spent: float = 0.0  # a budget's account, from its driver (`set_spend`)
    left: float = 0.0
    spent_at_send: float = 0.0
    window: Optional[int] = None  # the window the root last named
    allotment: Optional["Allotment"] = None  # a grant its driver has not taken yet
    other_kind: bool = False  # the last grant was of the other kind: nothing used, wants 0
    # What its calls met (`set_signals`): the driver's counts in all, the counts and time at
    # the start of the second under way, and its own cut until the root's grants come down.
    signals: Optional[tuple[float, float]] = None
    mark: tuple[float, float] = (0.0, 0.0)
    since: int = 0
    cut: Optional[float] = None
    cut_at: int = 0


class Allotment(NamedTuple):
    """A budget's new allotment for its driver (the C++ `budget_allotment`)."""

    units: float
    spent_at_send: float
    new_window: bool


class ClientState:
    """The C++ `basic_client_state`: the resources, their leases, and when to ask."""

    def __init__(
        self,
        client_id: str,
        minimum_interval: float = 1.0,
        idle_interval: float = 16.0,
        seed: int = 0xC11E0175,
    ) -> None:
        self.client_id = client_id
        self._idle = idle_interval
        self._schedule = RefreshSchedule(minimum_interval, idle_interval, seed)
        self._resources: dict[str, _Held] = {}
        self._releases: list[str] = []
        self._asked: set[str] = set()
        self._unasked = False
        self._start_unsent = False
        self._overloaded_unsent = False  # a second of overloads not reported yet
        self.answer_grants = 0  # grants in the last answer (adopted or not)
        self.notes: list[str] = []  # lines for the driver to log (it empties the list)

    # ---- resources ---------------------------------------------------------------------

    def add(self, rid: str, o: ResourceOptions, budget: bool = False) -> bool:
        _wire.check_id(rid, "resource_id")
        wants = 0.0 if o.wants is None else float(o.wants)
        known = self._resources.get(rid)
        self._resources[rid] = _Held(o.priority, wants, o.mode, o.safe_capacity, budget=budget)
        if known is None:
            self._unasked = True
            if rid in self._releases:
                self._releases = [r for r in self._releases if r != rid]
            self._sort()
        return known is None

    def remove(self, rid: str) -> bool:
        if self._resources.pop(rid, None) is None:
            return False
        self._releases.append(rid)
        return True

    def set_wants(self, rid: str, wants: float) -> None:
        if not _quantity(wants):
            raise ValueError("wants: must be a number between 0 and 1e15")
        r = self._resources.get(rid)
        if r is None:
            return
        if r.held_back:
            start = _start_wants(r)
            wants = max(wants, start if start is not None else 0.0)
        r.wants = wants

    def wants(self, rid: str) -> float:
        r = self._resources.get(rid)
        return r.wants if r is not None else 0.0

    def set_spend(self, rid: str, spent: float, left: float) -> None:
        """A budget's account, from its driver before each request (`set_spend`)."""
        if not _quantity(spent):
            raise ValueError("spent: must be a number between 0 and 1e15")
        r = self._resources.get(rid)
        if r is None or not r.budget:
            return
        r.spent = spent
        r.left = max(0.0, left) if math.isfinite(left) else 0.0

    def set_signals(self, rid: str, calls: float, overloads: float, now: int) -> None:
        """What the calls of `rid` to the protected service met, in all (`set_signals`): sent
        with the next request; a second with more than 0.5 % of them overloaded cuts what the
        client may use to what got through, less 3 %, until the root's grants come down."""
        if not _quantity(calls):
            raise ValueError("calls: must be a number between 0 and 1e15")
        if not _quantity(overloads):
            raise ValueError("overloads: must be a number between 0 and 1e15")
        if overloads > calls:
            raise ValueError("overloads must be at most calls")
        r = self._resources.get(rid)
        if r is None or r.budget:
            return
        if r.signals is None or calls < r.mark[0] or overloads < r.mark[1]:
            r.mark, r.since = (calls, overloads), now  # the first counts, or a new driver
        r.signals = (calls, overloads)
        span = to_s(now - r.since)
        if span < 1:
            return
        made, refused = calls - r.mark[0], overloads - r.mark[1]
        if made > 0 and refused > OVERLOAD_RATIO * made:
            through = (made - refused) / span * (1 - MARGIN)
            r.cut = through if r.cut is None else min(r.cut, through)
            r.cut_at = now
            self._overloaded_unsent = True
        r.mark, r.since = (calls, overloads), now

    def take_allotment(self, rid: str) -> Optional[Allotment]:
        """The allotment of `rid` granted by the last answer, once."""
        r = self._resources.get(rid)
        if r is None:
            return None
        a, r.allotment = r.allotment, None
        return a

    def hold_back(self, rid: str, now: int) -> None:
        """The fast start (`basic_client_state::hold_back`)."""
        r = self._resources.get(rid)
        if r is None or _capacity(r, now) != 0 or r.held_back:
            return
        r.held_back = True
        self._start(r, now)

    def take_releases(self) -> list[str]:
        out, self._releases = self._releases, []
        return out

    # ---- capacities ----------------------------------------------------------------------

    def capacity(self, rid: str, now: int) -> float:
        r = self._resources.get(rid)
        return 0.0 if r is None else _capacity(r, now)

    def lease(self, rid: str) -> Optional[Lease]:
        r = self._resources.get(rid)
        return r.lease if r is not None else None

    def window(self, rid: str) -> Optional[int]:
        """A budget's window, as the root last named it."""
        r = self._resources.get(rid)
        return r.window if r is not None else None

    def leased(self, rid: str, now: int) -> bool:
        r = self._resources.get(rid)
        return r is not None and r.lease is not None and now < r.lease.expiry

    # ---- the schedule ----------------------------------------------------------------------

    @property
    def failures(self) -> int:
        return self._schedule.failures

    @property
    def in_flight(self) -> bool:
        return self._schedule.in_flight

    def due(self, now: int) -> bool:
        return bool(self._resources) and self._schedule.due(now, self._news())

    def next_request(self) -> int:
        return self._schedule.next_request(self._news())

    def next_change(self, now: int) -> int:
        t = NEVER if self._schedule.in_flight or not self._resources else self.next_request()
        return min(t, self.earliest_expiry(now))

    def next(self, now: int) -> tuple[bool, int]:
        if self.due(now):
            return True, now
        return False, self.next_change(now)

    def make_request(self, now: int) -> dict[str, Any]:
        """The bulk `get_capacity` params; a request is in flight until its answer or failure."""
        items: list[dict[str, Any]] = []
        for rid, r in self._resources.items():
            if len(items) == _wire.MAX_RESOURCES:
                break
            wants = 0.0 if r.other_kind else r.wants
            if r.cut is not None:  # held back by its own cut, it wants no more than that
                wants = min(wants, r.cut)
            item: dict[str, Any] = {"resource_id": rid, "priority": r.priority, "wants": wants}
            if r.lease is not None and now < r.lease.expiry:
                item["has"] = {
                    "capacity": r.lease.capacity,
                    "expires_in": max(0.0, to_s(r.lease.expiry - now)),
                    "refresh_interval": to_s(r.lease.refresh_interval),
                }
            if r.budget:
                _add_spend(r, item)
            if r.signals is not None:
                item["signals"] = {"calls": r.signals[0], "overloads": r.signals[1]}
            items.append(item)
        self._unasked = len(self._resources) > len(items)
        self._start_unsent = False
        self._overloaded_unsent = False
        self._asked = {i["resource_id"] for i in items}
        self._schedule.sent(now)
        return {"client_id": self.client_id, "resources": items}

    def on_reply(self, result: Any, now: int) -> tuple[str, list[str]]:
        """Adopts the server's result: the event, and why grants were ignored. A result that is
        no capacity answer, or a non-master's, is a failure (problems: its reason)."""
        answer = _wire.read_answer(result)
        if isinstance(answer, str):
            return self.on_failure(now), [answer]
        if not answer.is_master:
            return self.on_failure(now), ["answered as not master"]
        self.answer_grants = len(answer.grants)
        grants, problems = _wire.screen_grants(answer.grants, self._asked)
        interval = math.inf
        sent = self._schedule.last_request
        for g in grants:
            r = self._resources.get(g.resource_id)
            if r is None:
                continue
            r.server_safe = g.safe_capacity
            # Its own cut stays until a grant comes down to it, for two refresh intervals at
            # most (`keep_cut`).
            if r.cut is not None and (g.capacity <= r.cut
                                      or now - r.cut_at >= 2 * to_ns(g.refresh_interval)):
                r.cut = None
            capacity = 0.0 if self._other_kind(r, g) else g.capacity
            r.lease = Lease(capacity, sent + to_ns(g.expires_in), to_ns(g.refresh_interval))
            if r.budget:
                new_window = r.window is not None and g.budget_window is not None \
                    and g.budget_window != r.window
                if g.budget_window is not None:
                    r.window = g.budget_window
                r.allotment = Allotment(capacity, r.spent_at_send, new_window)
            interval = min(interval, g.refresh_interval if g.refresh_interval > 0 else self._idle)
            left = to_s(r.lease.expiry - now)
            if left > 0:
                interval = min(interval, left)
            if capacity > 0:
                r.held_back = False
        event = self._schedule.answered(now, interval)
        for r in self._resources.values():
            if r.held_back and not r.fast_started:
                self._start(r, now)
        return event, problems

    def _other_kind(self, r: _Held, g: Any) -> bool:
        # `basic_client_state::other_kind`: a grant of the other kind gives nothing, and is
        # told (in `notes`) when that begins.
        other = (g.budget_window is not None) != r.budget
        if other and not r.other_kind:
            self.notes.append(
                f"resource {g.resource_id} is not a budget at the server: this budget handle "
                "takes nothing of it, and asks for nothing" if r.budget else
                f"resource {g.resource_id} is a budget at the server: use a budget handle; "
                "this one takes nothing of it, and asks for nothing")
        r.other_kind = other
        return other

    def on_failure(self, now: int) -> str:
        return self._schedule.failed(now, self.earliest_expiry(now))

    def call_timeout(self, now: int, configured: float) -> float:
        return RefreshSchedule.call_timeout(now, self.earliest_expiry(now), configured)

    def earliest_expiry(self, now: int) -> int:
        t = NEVER
        for r in self._resources.values():
            if r.lease is not None and r.lease.expiry > now:
                t = min(t, r.lease.expiry)
        return t

    # ---- inside ----------------------------------------------------------------------------

    def _sort(self) -> None:
        # The C++ state keeps its resources in id order (byte order; for UTF-8 the same as
        # code point order); requests list them so.
        self._resources = dict(sorted(self._resources.items()))

    def _news(self) -> bool:
        return self._unasked or self._start_unsent or self._overloaded_unsent

    def _start(self, r: _Held, now: int) -> None:
        wants = _start_wants(r)
        if wants is None:
            return  # no answer yet: on_reply comes back here
        r.wants = max(r.wants, wants)
        self._start_unsent = True
        if not r.fast_started:
            r.fast_started = True
            self._schedule.expedite(now)


def _add_spend(r: _Held, item: dict[str, Any]) -> None:
    # A budget's report: its spend in the window the root last named (none before the first
    # answer: nothing was spent), and what it has left of a live allotment.
    r.spent_at_send = r.spent
    if r.window is not None:
        item["spend"] = {"window": r.window, "spent": r.spent}
    if "has" in item:
        item["has"]["capacity"] = min(item["has"]["capacity"], r.left)


def _start_wants(r: _Held) -> Optional[float]:
    if r.server_safe is None:
        return None
    return min(r.server_safe, _wire.MAX_QUANTITY) if r.server_safe > 1 else 1.0


def _capacity(r: _Held, now: int) -> float:
    if r.lease is not None and now < r.lease.expiry:
        c = r.lease.capacity
    elif r.budget:
        return 0.0  # nothing of a budget is spent without an allotment
    else:
        c = fallback_capacity(r.mode, r.wants, r.safe_capacity, r.server_safe)
    if r.cut is None:
        return c
    return r.cut if c < 0 else min(c, r.cut)


def fallback_capacity(
    mode: str, wants: float, safe_capacity: Optional[float], server_safe: Optional[float]
) -> float:
    """What a resource may use without a lease (-1: unlimited)."""
    if mode == "pessimistic":
        return 0.0
    if mode == "optimistic":
        return wants
    if safe_capacity is not None:
        return safe_capacity
    return server_safe if server_safe is not None else 0.0


class DemandEstimator:
    """The time-weighted mean of the samples of the last `window` seconds (at least one kept),
    as the C++ `demand_estimator`."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._samples: list[tuple[float, float]] = []
        self._weighted = 0.0
        self._covered = 0.0

    def add(self, value: float, span: float) -> None:
        if not span > 0 or not value >= 0:
            return
        self._samples.append((value * span, span))
        self._weighted += value * span
        self._covered += span
        while len(self._samples) > 1 and self._covered - self._samples[0][1] >= self._window:
            w, s = self._samples.pop(0)
            self._weighted -= w
            self._covered -= s

    def estimate(self) -> float:
        return max(0.0, self._weighted / self._covered) if self._covered > 0 else 0.0


def rate_demand(asked: float, span: float, throttled: bool, capacity: float, headroom: float) -> float:
    """Permits asked for a second over `span`; at least capacity x `headroom` when a waiter was
    delayed (`doorman::rate_demand`)."""
    value = asked / span
    if throttled:
        value = max(value, max(capacity, 1.0) * headroom)
    return value


def sampled_wants(
    demand: DemandEstimator, value: float, span: float, throttled: bool, gauge: bool
) -> float:
    """The wants after one sample (`doorman::sampled_wants`, headroom 1, min_wants 0)."""
    demand.add(value, span)
    wants = max(demand.estimate() * 1.0, 0.0)
    if throttled:
        wants = max(wants, value)
    if gauge:
        wants = math.ceil(wants - 1e-6)
    return min(wants, _wire.MAX_QUANTITY) if wants > 0 else 0.0


@dataclass
class Entry:
    """One resource as the client core holds it: its limiter and what measures its demand."""

    id: str
    kind: str  # "rate", "gauge" or "budget"
    estimate: bool  # wants measured from use
    limiter: Union[RateLimiter, Gauge, BudgetCounter]
    demand: DemandEstimator
    handles: int = 1
    capacity: float = 0.0
    leased: bool = False
    first_capacity: bool = True
    holding_back: bool = False
    asked_seen: float = 0.0
    delayed_seen: int = 0
    answers: int = 0  # what the protected service answered (`record_answers`), in all
    overloads: int = 0
    # set by the driver: called when the capacity changes (the asyncio waiters' wake-up)
    on_change: Optional[Callable[[], None]] = None
    waiters: set[tuple[Any, Any]] = field(default_factory=set)


class Step(NamedTuple):
    """What the driver does next: `refresh` (send `params` as get_capacity, within `timeout`
    seconds), `release` (send `params` as release_capacity), or `wait` until `at`."""

    action: str
    params: Any = None
    timeout: float = 0.0
    at: int = NEVER


# The client core's options and their defaults (the C++ `client_options`' too).
TIMING = {
    "call_timeout": 5.0,
    "minimum_refresh_interval": 1.0,
    "sample_interval": 1.0,
    "demand_window": 10.0,
    "throttled_headroom": 2.0,
}


def spends_for(ids: list[str], spends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last reports (`spends`, in the order made) a release of `ids` carries: the latest
    per id, for the ids it releases, in their order (`doorman::spends_for`)."""
    out: list[dict[str, Any]] = []
    for rid in ids:
        last = next((s for s in reversed(spends) if s["resource_id"] == rid), None)
        if last is not None and all(s["resource_id"] != rid for s in out):
            out.append(last)
    return out


class ClientCore:
    """The C++ `client_core` without its I/O: the state, a limiter per resource, demand
    sampling, and the order of calls (releases first, then refreshes)."""

    def __init__(
        self,
        client_id: str,
        now: int,
        *,
        seed: int = 0xC11E0175,
        clock: Callable[[], int] = time.monotonic_ns,
        **options: float,
    ) -> None:
        """`options`: those of `TIMING` (seconds, and the throttled headroom), by name."""
        o = {**TIMING, **options}
        if len(o) != len(TIMING):
            raise TypeError(f"unknown options: {sorted(set(o) - set(TIMING))}")
        sample_interval = o["sample_interval"]
        self.state = ClientState(client_id, o["minimum_refresh_interval"], 16.0, seed)
        self.clock = clock  # the limiters' (the state is given the time)
        self.entries: dict[str, Entry] = {}
        self.call_timeout = o["call_timeout"]
        self.sample_interval = sample_interval
        self.demand_window = o["demand_window"]
        self.throttled_headroom = max(1.0, o["throttled_headroom"])
        self.closed = False
        self._next_sample = now + to_ns(sample_interval)
        self._last_sample = now
        self._releases: list[str] = []
        self._releasing: list[str] = []
        self._spends: list[dict[str, Any]] = []  # the budgets' last reports, for a release
        self._spending: list[dict[str, Any]] = []  # those of the release in flight

    def attach(self, rid: str, kind: str, o: ResourceOptions, now: int) -> Entry:
        """The entry of `rid`: new, or shared with the other handles to it."""
        known = self.entries.get(rid)
        if known is not None:
            if known.kind != kind:
                raise ValueError(f"resource_id: {rid!r} is already a {known.kind} resource")
            known.handles += 1
            return known
        limiter: Union[RateLimiter, Gauge, BudgetCounter]
        if kind == "rate":
            limiter = RateLimiter(0.0, o.burst, self.clock)
        else:
            limiter = Gauge() if kind == "gauge" else BudgetCounter(self.clock)
        e = Entry(rid, kind, o.wants is None, limiter, DemandEstimator(self.demand_window))
        self.state.add(rid, o, budget=kind == "budget")
        self.entries[rid] = e
        wants = 0.0 if o.wants is None else float(o.wants)
        self._apply(e, 0.0 if kind == "budget" else
                    fallback_capacity(o.mode, wants, o.safe_capacity, None))
        return e

    def detach(self, rid: str) -> bool:
        """A handle went: the last one removes the resource (released with the next call)."""
        e = self.entries.get(rid)
        if e is None:
            return False
        e.handles -= 1
        if e.handles > 0:
            return False
        del self.entries[rid]
        spend = self._spend_of(e)
        if spend is not None:
            self._spends.append(spend)
        self.state.remove(rid)
        e.limiter.close()
        return True

    def held_back(self, rid: str, now: int) -> bool:
        """A caller was held back at capacity 0: the fast start (once per stretch at 0). Whether
        the next step may change (the driver looks again)."""
        e = self.entries.get(rid)
        if e is None or not e.estimate or e.capacity != 0 or self.closed or e.holding_back:
            return False
        e.holding_back = True
        self.state.hold_back(rid, now)
        return True

    def step(self, now: int) -> Step:
        """What to do at `now`: samples demand when due, pushes capacities into the limiters,
        then a release, a refresh, or a wait (`client_core::next_step` and `next_call`)."""
        if self.closed:
            return Step("wait")
        if now >= self._next_sample:
            self._sample(now)
            self._next_sample = now + to_ns(self.sample_interval)
        self.push_capacities(now)
        if not self._releases:
            self._releases = self.state.take_releases()
        if self._releases:
            self._releasing, self._releases = self._releases, []
            return Step("release", self._release_params(self._releasing))
        send, at = self.state.next(now)
        if not send:
            return Step("wait", at=min(at, self._next_sample))
        timeout = self.state.call_timeout(now, self.call_timeout)
        for rid, e in self.entries.items():
            self._record_signals(rid, e, now)  # as of the send: the root takes rates
            if isinstance(e.limiter, BudgetCounter):
                self.state.set_spend(rid, e.limiter.report(), e.limiter.left())
        return Step("refresh", self.state.make_request(now), timeout)

    def answered(self, result: Any, now: int) -> tuple[str, list[str]]:
        """The answer to the last step's call (its `result`)."""
        if self._releasing:
            self._releasing, self._spending = [], []
            return "none", []
        event, problems = self.state.on_reply(result, now)
        self._adopt_allotments()
        self.push_capacities(now)
        return event, problems

    def failed(self, now: int) -> str:
        """The last step's call failed (a release is not retried: its leases run out)."""
        if self._releasing:
            self._releasing, self._spending = [], []
            return "none"
        event = self.state.on_failure(now)
        self.push_capacities(now)
        return event

    def close(self) -> tuple[list[str], list[dict[str, Any]]]:
        """Closed is closed: every limiter admits nothing from now on. The ids to release, and
        the budgets' last reports (the release's `spends`)."""
        self.closed = True
        for e in self.entries.values():
            e.limiter.close()
        ids = sorted(self.entries) + self.state.take_releases() + self._releases + self._releasing
        spends = self._spends + self._spending
        spends += [s for _, e in sorted(self.entries.items()) if (s := self._spend_of(e))]
        self._releases, self._releasing, self._spends, self._spending = [], [], [], []
        return ids, spends_for(ids, spends)

    def push_capacities(self, now: int) -> list[Entry]:
        """Every resource's capacity into its limiter; the entries whose capacity changed."""
        changed = []
        for rid, e in self.entries.items():
            c = self.state.capacity(rid, now)
            e.leased = self.state.leased(rid, now)
            if c == e.capacity and not e.first_capacity:
                continue
            e.first_capacity = False
            self._apply(e, c)
            if c != 0:
                e.holding_back = False
            changed.append(e)
            if e.on_change is not None:
                e.on_change()
        return changed

    def wants(self, rid: str) -> float:
        return self.state.wants(rid)

    @staticmethod
    def _apply(e: Entry, c: float) -> None:
        e.limiter.set_capacity(c)  # a rate's burst follows it unless fixed
        e.capacity = c

    def _adopt_allotments(self) -> None:
        # Each budget's new allotment, into its counter (`client_core::adopt_allotments`).
        for rid, e in self.entries.items():
            if not isinstance(e.limiter, BudgetCounter):
                continue
            a = self.state.take_allotment(rid)
            lease = self.state.lease(rid)
            if a is not None and lease is not None:
                e.limiter.grant(a.units, a.spent_at_send, a.new_window, lease.expiry)
                if e.on_change is not None:
                    e.on_change()  # its waiters look again

    def _spend_of(self, e: Entry) -> Optional[dict[str, Any]]:
        # A budget's last report, for a release (none before the root named a window).
        window = self.state.window(e.id)
        if not isinstance(e.limiter, BudgetCounter) or window is None:
            return None
        e.limiter.close()
        return {"resource_id": e.id, "window": window, "spent": e.limiter.report()}

    def _budget_wants(self, e: Entry, span: float) -> float:
        # `client_core::budget_wants`: units to last two refreshes at the rate asked.
        assert isinstance(e.limiter, BudgetCounter)
        lease = self.state.lease(e.id)
        refresh = to_s(lease.refresh_interval) if lease is not None else self.sample_interval
        horizon = 2 * max(refresh, self.sample_interval)
        asked, refused = e.limiter.attempted, e.limiter.refused
        throttled = refused != e.delayed_seen
        allotment = lease.capacity if lease is not None else 0.0
        value = rate_demand(asked - e.asked_seen, span, throttled, allotment / horizon,
                            self.throttled_headroom)
        e.asked_seen, e.delayed_seen = asked, refused
        per_second = sampled_wants(e.demand, value, span, throttled, False)
        return min(per_second * horizon, _wire.MAX_QUANTITY)

    def _record_signals(self, rid: str, e: Entry, now: int) -> None:
        """What the service answered `rid`'s calls, into the state (`client_core::record_signals`):
        at each sample, and before each refresh."""
        if e.answers > 0 and e.kind != "budget":
            self.state.set_signals(rid, float(e.answers), float(min(e.answers, e.overloads)), now)

    def _sample(self, now: int) -> None:
        span = to_s(now - self._last_sample)
        self._last_sample = now
        for rid, e in self.entries.items():
            self._record_signals(rid, e, now)
            if not e.estimate or not span > 0:
                continue
            if isinstance(e.limiter, BudgetCounter):
                self.state.set_wants(rid, self._budget_wants(e, span))
                continue
            throttled = False
            if isinstance(e.limiter, RateLimiter):
                asked, delayed = e.limiter.asked, e.limiter.delayed
                throttled = delayed != e.delayed_seen
                value = rate_demand(asked - e.asked_seen, span, throttled, e.capacity,
                                    self.throttled_headroom)
                e.asked_seen, e.delayed_seen = asked, delayed
            else:
                value = float(e.limiter.take_peak())
            wants = sampled_wants(e.demand, value, span, throttled, e.kind == "gauge")
            self.state.set_wants(rid, wants)

    def _release_params(self, ids: list[str]) -> dict[str, Any]:
        params: dict[str, Any] = {"client_id": self.state.client_id, "resources": ids}
        self._spending, self._spends = spends_for(ids, self._spends), []
        if self._spending:
            params["spends"] = self._spending
        return params
