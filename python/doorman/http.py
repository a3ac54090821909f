"""HTTP helpers (docs/python.md): throttle outgoing calls to a resource's rate, and answer 429
with `Retry-After` in a WSGI or ASGI app. No dependency on any HTTP package: `requests` and
`urllib3` are used only if the caller hands in their objects.

    api = client.rate("partner-api")

    @doorman.http.throttled(api)              # any function: one permit per call
    def fetch(url): ...

    opener = urllib.request.build_opener(doorman.http.ThrottlingHandler(api))
    session = doorman.http.throttle_session(requests.Session(), api)

    app = doorman.http.WsgiLimit(app, client.rate("inbound"))   # 429 when over
    app = doorman.http.WsgiLimit(app, client.budget("tokens"), cost=2000,
                                 used="X-Tokens-Used")          # settled from the response
"""

from __future__ import annotations

import functools
import math
import time
import urllib.request
from typing import Any, Awaitable, Callable, Iterable, Optional, TypeVar, Union

from ._answers import check_latency_target, past_target
from .client import RateResource

F = TypeVar("F", bound=Callable[..., Any])


def throttled(resource: RateResource, n: float = 1, timeout: Optional[float] = None) -> Callable[[F], F]:
    """A decorator: each call of the function first waits for `n` permits of `resource`
    (TimeoutError after `timeout` seconds, nothing consumed)."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def call(*args: Any, **kwargs: Any) -> Any:
            resource.wait(n, timeout)
            return f(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


def overloaded(status: int, headers: Any = None) -> bool:
    """Whether an HTTP answer says the service is overloaded: 429, 503, a `Retry-After`, or a
    provider's remaining quota at 0 (`quota_spent`)."""
    if status in (429, 503):
        return True
    try:
        return headers is not None and (headers.get("Retry-After") is not None or
                                        quota_spent(headers))
    except AttributeError:
        return False


def quota_spent(headers: Any) -> bool:
    """Whether a header whose name holds both `ratelimit` and `remaining` (any case:
    `X-RateLimit-Remaining`, `RateLimit-Remaining`, `x-ratelimit-remaining-requests`,
    `anthropic-ratelimit-tokens-remaining`) says 0 or less is left. Headers with `items()`
    (urllib's, requests', urllib3's) or a list of pairs; a value that is not a number says
    nothing."""
    try:
        pairs = headers.items() if hasattr(headers, "items") else headers
        for name, value in pairs:
            n = str(name).lower()
            if "ratelimit" in n and "remaining" in n:
                try:
                    if float(str(value).split(",")[0].strip()) <= 0:
                        return True
                except ValueError:
                    continue
    except (TypeError, ValueError):
        return False
    return False


class ThrottlingHandler(urllib.request.BaseHandler):
    """A `urllib.request` handler: every request opened through the opener waits for a permit,
    and every answer is recorded (`record_answer`): overloaded when `overloaded` says so, or
    when it came more than `latency_target` seconds after the request was sent."""

    handler_order = 100  # before the handlers that open connections, and that raise on 4xx

    def __init__(self, resource: RateResource, timeout: Optional[float] = None,
                 latency_target: Optional[float] = None) -> None:
        self.resource = resource
        self.timeout = timeout
        self.latency_target = check_latency_target(latency_target)

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        self.resource.wait(1, self.timeout)
        req._doorman_sent = time.monotonic()  # type: ignore[attr-defined]
        return req

    def http_response(self, req: urllib.request.Request, response: Any) -> Any:
        late = past_target(self.latency_target, getattr(req, "_doorman_sent", None))
        self.resource.record_answer(late or overloaded(response.status, response.headers))
        return response

    https_request = http_request
    https_response = http_response


def throttle_session(session: Any, resource: RateResource, timeout: Optional[float] = None,
                     latency_target: Optional[float] = None) -> Any:
    """Makes every request of a `requests.Session` (or anything with a `request(method, url,
    ...)` method, such as a `urllib3.PoolManager`) wait for a permit first, and records its
    answer (`record_answer`): overloaded when `overloaded` says so, or when it came more than
    `latency_target` seconds after the request was sent. Returns `session`."""
    check_latency_target(latency_target)
    send = session.request

    @functools.wraps(send)
    def request(*args: Any, **kwargs: Any) -> Any:
        resource.wait(1, timeout)
        sent = time.monotonic()
        response = send(*args, **kwargs)
        status = getattr(response, "status_code", getattr(response, "status", 0))
        if isinstance(status, int):
            late = past_target(latency_target, sent)
            resource.record_answer(late or overloaded(status, getattr(response, "headers", None)))
        return response

    session.request = request
    return session


def retry_after_seconds(retry_after: float) -> str:
    """`Retry-After` in whole seconds, rounded up, at least 1 (a capacity of 0: 1, since the
    next refresh may bring some)."""
    if math.isinf(retry_after):
        return "1"
    return str(max(1, math.ceil(retry_after)))


# What a response says a call really cost: the value of a header, or a function of the status
# and headers (None: not said). None when not said, or not a finite number >= 0.
UsedFrom = Union[str, Callable[[int, list[tuple[str, str]]], Optional[float]]]


def _used(used: Optional[UsedFrom], status: int, headers: list[tuple[str, str]]) -> Optional[float]:
    if used is None:
        return None
    if callable(used):
        value: Any = used(status, headers)
    else:
        name = used.lower()
        value = next((v for k, v in headers if k.lower() == name), None)
    try:
        n = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return n if n is not None and math.isfinite(n) and n >= 0 else None


def _text(b: Any) -> str:
    return b.decode("latin-1") if isinstance(b, (bytes, bytearray)) else str(b)


def _settler(resource: Any) -> Callable[[float, float, Any], Any]:
    """How a call admitted now will be settled, given `try_acquire`'s answer: a budget's settle
    names the window the call was admitted in (read before `try_acquire`), so that a refund
    never lands in a later one; a rate's names the call's slot (its answer's), so that a refund
    gives back only time no later call holds."""
    window = getattr(resource, "window", None)
    if isinstance(window, int) and not isinstance(window, bool):
        return lambda reserved, used, got: resource.settle(reserved, used, window)

    def by_slot(reserved: float, used: float, got: Any) -> Any:
        slot = getattr(got, "slot", None)
        if isinstance(slot, int) and not isinstance(slot, bool):
            return resource.settle(reserved, used, slot)
        return resource.settle(reserved, used)
    return by_slot


def _refuse(got: Any) -> str:
    """`Retry-After` for a refusal: a rate's own wait, or 1 (a budget's refusal names none: its
    next allotment comes with the next refresh)."""
    return retry_after_seconds(getattr(got, "retry_after", math.inf))


class WsgiLimit:
    """WSGI middleware: a request `resource` refuses is answered 429 with `Retry-After`. With
    `used`, the call is admitted at `cost` and settled at what its response says it used."""

    def __init__(self, app: Callable[..., Iterable[bytes]], resource: Any,
                 cost: Union[float, Callable[[dict[str, Any]], float]] = 1,
                 used: Optional[UsedFrom] = None) -> None:
        self.app = app
        self.resource = resource
        self.cost = cost
        self.used = used

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        n = self.cost(environ) if callable(self.cost) else self.cost
        settle = _settler(self.resource)
        got = self.resource.try_acquire(n)
        if got:
            if self.used is None:
                return self.app(environ, start_response)

            def settling(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
                code = int(status.split(" ", 1)[0]) if status[:3].isdigit() else 0
                real = _used(self.used, code, headers)
                if real is not None:
                    settle(n, real, got)
                return start_response(status, headers, *rest)

            return self.app(environ, settling)
        body = b"too many requests\n"
        start_response("429 Too Many Requests", [
            ("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
            ("Retry-After", _refuse(got))])
        return [body]


class AsgiLimit:
    """ASGI middleware: an HTTP request `resource` refuses is answered 429 with `Retry-After`
    (other scopes pass through). With `used`, the call is admitted at `cost` and settled at
    what its response's start says it used."""

    def __init__(self, app: Callable[..., Awaitable[None]], resource: Any,
                 cost: float = 1, used: Optional[UsedFrom] = None) -> None:
        self.app = app
        self.resource = resource
        self.cost = cost
        self.used = used

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        settle = _settler(self.resource)
        got = self.resource.try_acquire(self.cost)
        if got:
            if self.used is None:
                await self.app(scope, receive, send)
                return

            async def settling(message: dict[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    headers = [(_text(k), _text(v)) for k, v in message.get("headers", [])]
                    real = _used(self.used, int(message.get("status", 0)), headers)
                    if real is not None:
                        settle(self.cost, real, got)
                await send(message)

            await self.app(scope, receive, settling)
            return
        body = b"too many requests\n"
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", _refuse(got).encode())]})
        await send({"type": "http.response.body", "body": body})
