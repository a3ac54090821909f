"""HTTP helpers (docs/python.md): throttle outgoing calls to a resource's rate, and answer 429
with `Retry-After` in a WSGI or ASGI app. No dependency on any HTTP package: `requests` and
`urllib3` are used only if the caller hands in their objects.

    api = client.rate("partner-api")

    @doorman.http.throttled(api)              # any function: one permit per call
    def fetch(url): ...

    opener = urllib.request.build_opener(doorman.http.ThrottlingHandler(api))
    session = doorman.http.throttle_session(requests.Session(), api)

    app = doorman.http.WsgiLimit(app, client.rate("inbound"))   # 429 when over
"""

from __future__ import annotations

import functools
import math
import urllib.request
from typing import Any, Awaitable, Callable, Iterable, Optional, TypeVar, Union

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


class ThrottlingHandler(urllib.request.BaseHandler):
    """A `urllib.request` handler: every request opened through the opener waits for a permit."""

    handler_order = 100  # before the handlers that open connections

    def __init__(self, resource: RateResource, timeout: Optional[float] = None) -> None:
        self.resource = resource
        self.timeout = timeout

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        self.resource.wait(1, self.timeout)
        return req

    https_request = http_request


def throttle_session(session: Any, resource: RateResource, timeout: Optional[float] = None) -> Any:
    """Makes every request of a `requests.Session` (or anything with a `request(method, url,
    ...)` method, such as a `urllib3.PoolManager`) wait for a permit first. Returns `session`."""
    send = session.request

    @functools.wraps(send)
    def request(*args: Any, **kwargs: Any) -> Any:
        resource.wait(1, timeout)
        return send(*args, **kwargs)

    session.request = request
    return session


def retry_after_seconds(retry_after: float) -> str:
    """`Retry-After` in whole seconds, rounded up, at least 1 (a capacity of 0: 1, since the
    next refresh may bring some)."""
    if math.isinf(retry_after):
        return "1"
    return str(max(1, math.ceil(retry_after)))


class WsgiLimit:
    """WSGI middleware: a request `resource` refuses is answered 429 with `Retry-After`."""

    def __init__(self, app: Callable[..., Iterable[bytes]], resource: RateResource,
                 cost: Union[float, Callable[[dict[str, Any]], float]] = 1) -> None:
        self.app = app
        self.resource = resource
        self.cost = cost

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        n = self.cost(environ) if callable(self.cost) else self.cost
        got = self.resource.try_acquire(n)
        if got:
            return self.app(environ, start_response)
        body = b"too many requests\n"
        start_response("429 Too Many Requests", [
            ("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
            ("Retry-After", retry_after_seconds(got.retry_after))])
        return [body]


class AsgiLimit:
    """ASGI middleware: an HTTP request `resource` refuses is answered 429 with `Retry-After`
    (other scopes pass through)."""

    def __init__(self, app: Callable[..., Awaitable[None]], resource: RateResource,
                 cost: float = 1) -> None:
        self.app = app
        self.resource = resource
        self.cost = cost

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        got = self.resource.try_acquire(self.cost)
        if got:
            await self.app(scope, receive, send)
            return
        body = b"too many requests\n"
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", retry_after_seconds(got.retry_after).encode())]})
        await send({"type": "http.response.body", "body": body})
