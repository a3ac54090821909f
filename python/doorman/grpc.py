"""gRPC helpers (docs/python.md): a client interceptor for grpcio that makes each call of a
channel wait for a permit of a rate resource, and records what the call met for a capacity the
root learns (docs/learned-capacity.md): `RESOURCE_EXHAUSTED` and `UNAVAILABLE` as overloaded.

    api = client.rate("model-provider")
    channel = grpc.intercept_channel(grpc.insecure_channel(address),
                                     doorman.grpc.ThrottlingInterceptor(api))

This module needs grpcio (Debian: python3-grpcio); the rest of the package does not.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import grpc  # type: ignore

from .client import RateResource
from ._answers import check_latency_target, past_target

#: The status codes that say the service is overloaded.
OVERLOADED_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE})


def overloaded(code: Any) -> bool:
    """Whether a gRPC status says the service is overloaded: `RESOURCE_EXHAUSTED` or
    `UNAVAILABLE`, as a `grpc.StatusCode` or as its number (8, 14)."""
    if isinstance(code, grpc.StatusCode):
        return code in OVERLOADED_CODES
    return isinstance(code, int) and not isinstance(code, bool) and code in (8, 14)


class ThrottlingInterceptor(grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
                            grpc.StreamUnaryClientInterceptor):  # type: ignore[misc]
    """Each unary call (and each client-streaming call) waits for `n` permits of `resource`
    first (TimeoutError after `timeout` seconds, nothing consumed, the call not made). When it
    ends, its status is recorded on the resource (`record_answer`), overloaded when
    `is_overloaded(code)` says so (by default `overloaded`). A call the caller cancelled is not
    recorded: the service did not answer it. With `latency_target` (seconds), a call that
    ended more than that after it was made is recorded overloaded too."""

    def __init__(self, resource: RateResource, n: float = 1, timeout: Optional[float] = None,
                 is_overloaded: Callable[[Any], bool] = overloaded,
                 latency_target: Optional[float] = None) -> None:
        self.resource = resource
        self.n = n
        self.timeout = timeout
        self.is_overloaded = is_overloaded
        self.latency_target = check_latency_target(latency_target)

    def _record(self, call: Any, sent: float) -> None:
        try:
            code = call.code()
        except Exception:  # noqa: BLE001: a call without a status says nothing
            return
        if code is None or code == grpc.StatusCode.CANCELLED:
            return
        late = past_target(self.latency_target, sent)
        self.resource.record_answer(late or bool(self.is_overloaded(code)))

    def _intercept(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.resource.wait(self.n, self.timeout)
        sent = time.monotonic()
        call = continuation(details, request)
        call.add_done_callback(lambda done: self._record(done, sent))
        return call

    def intercept_unary_unary(self, continuation: Callable[..., Any], client_call_details: Any,
                              request: Any) -> Any:
        return self._intercept(continuation, client_call_details, request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], client_call_details: Any,
                               request_iterator: Any) -> Any:
        return self._intercept(continuation, client_call_details, request_iterator)
