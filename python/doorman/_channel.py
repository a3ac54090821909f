"""A connection to a tree position, as the C++ `net::channel` keeps one (docs/client.md).

Several addresses; the master found through `mastership` answers (redirects followed, at most
4 per call); a call that passes its deadline leaves its connection, and the next call goes to
the next address; once every address has failed in a row, connecting waits a jittered backoff
(50 ms doubling to 5 s), or the retry delay a node's refusal names. Used from one thread.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import threading
import time
from typing import Any, Callable, Optional, Sequence

from . import _wire

MAX_ANSWER_BYTES = 1 << 20
MAX_REDIRECTS = 4



def refusal_text(err: Any, retry_after: float) -> str:
    """A node's refusal as the C++ channel says it: ``refused (-32000 too many connections; try
    again later; retry after 1 s)``. The peer's message is untrusted: cut to 200 characters of
    printable ASCII."""
    parts = []
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        parts.append(str(code))
    message = err.get("message") if isinstance(err, dict) else None
    if isinstance(message, str):
        parts.append("".join(c if " " <= c < "\x7f" else "?" for c in message[:200]))
    text = " ".join(parts)
    if retry_after > 0:
        text += f"; retry after {retry_after:g} s"
    return f"refused ({text})"

class CallError(Exception):
    """A call that got no result: `kind` is one of unreachable, timed_out, error_answer,
    bad_answer, no_master, too_many_redirects."""

    def __init__(self, kind: str, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port` too); ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


class Channel:
    def __init__(
        self,
        addresses: Sequence[str],
        *,
        ssl_context: Optional[ssl.SSLContext] = None,
        server_name: Optional[str] = None,
        connect_timeout: float = 2.0,
        initial_backoff: float = 0.05,
        maximum_backoff: float = 5.0,
        log: Optional[Callable[[str], None]] = None,
        rng: Optional[random.Random] = None,
    ) -> None:
        if not addresses:
            raise ValueError("addresses: at least one host:port is needed")
        for a in addresses:
            parse_address(a)
        self.addresses = list(addresses)
        self._current = self.addresses[0]
        self._next = 0  # index of the next address to try after a failure
        self._ssl = ssl_context
        self._server_name = server_name
        self._connect_timeout = connect_timeout
        self._initial_backoff = initial_backoff
        self._maximum_backoff = maximum_backoff
        self._log = log
        self._rng = rng or random.Random()
        self._sock: Optional[socket.socket] = None
        self._buffer = b""
        self._id = 0
        self.failures = 0  # in a row, since the last answer
        self._round_failures = 0  # of the current round of addresses
        self._connect_at = 0.0  # monotonic: no connection attempt before
        self._floor_until = 0.0  # monotonic: none before, whatever (a retry delay asked for)
        self._retry_after = 0.0  # a refusal's retry hint, until some node answers
        self._problem = ""  # the last failure's, for the error of a call that gives up
        self.connects = 0  # connection attempts made
        self._interrupted = threading.Event()

    def interrupt(self) -> None:
        """From another thread: the call in flight ends at once with CallError("cancelled"),
        and so do later ones until `resume()`."""
        self._interrupted.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def resume(self) -> None:
        self._interrupted.clear()

    def _check_interrupted(self) -> None:
        if self._interrupted.is_set():
            self.close()
            raise CallError("cancelled", "call cancelled")

    @property
    def current(self) -> str:
        return self._current

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._buffer = b""

    def call(self, method: str, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        """The result of `method` on the master, or CallError; `deadline` is monotonic."""
        redirects = 0
        start = time.monotonic()
        first = True  # the attempt that may cut the backoff short
        while True:
            self._check_interrupted()
            if self._sock is None:
                try:
                    # The first attempt waits out the backoff only until halfway to the deadline
                    # (a refresh's deadline is half its lease's time left), so that a peer back
                    # within the backoff is reached while the lease runs; one early attempt a
                    # call (as the C++ failover's `attempt_at`).
                    early = (start + deadline) / 2 if first else None
                    first = False
                    self._connect(deadline, early)
                except CallError:
                    if self._connect_at >= deadline or time.monotonic() >= deadline:
                        raise
                    continue  # the next address, or the same after the backoff
            try:
                answer = self._exchange(method, params, deadline)
            except CallError as e:
                if e.kind == "timed_out":
                    self._fail(f"{self._current} did not answer {method} in time", move=True)
                    raise
                if e.kind == "unreachable" and time.monotonic() < deadline:
                    continue  # the connection broke: reconnect and send again (idempotent)
                raise
            m = _wire.read_mastership(answer)
            if m is None or m.is_master:
                return answer
            redirects += 1
            if redirects > MAX_REDIRECTS:
                raise CallError("too_many_redirects", "too many mastership redirects")
            self.close()
            if m.master:
                # where the non-master says the master is (one it cannot say, or that cannot
                # be dialled, is a failed connect: the next address)
                self._current = m.master
            else:
                self._advance()
                self._connect_at = time.monotonic() + self._backoff()
            if time.monotonic() >= deadline:
                raise CallError("no_master", "no master found before the deadline")

    # ---- connecting ----------------------------------------------------------------------

    def _advance(self) -> None:
        self._current = self.addresses[self._next % len(self.addresses)]
        self._next += 1

    def _backoff(self) -> float:
        doubled = self._initial_backoff * 2.0 ** min(self.failures, 20)
        ceiling = min(self._maximum_backoff, doubled)
        return max(self._retry_after, ceiling * self._rng.uniform(0.5, 1.0))

    def _fail(self, problem: str, move: bool) -> None:
        """A failed attempt or call: the connection goes; after a whole round, back off."""
        self.close()
        self.failures += 1
        self._round_failures += 1
        self._problem = problem
        if self._log:
            self._log(f"warning: {problem}")
        if move:
            self._advance()
        if self._round_failures >= len(self.addresses):
            self._round_failures = 0
            self._connect_at = time.monotonic() + self._backoff()
            self._floor_until = time.monotonic() + self._retry_after

    def _connect(self, deadline: float, early: Optional[float] = None) -> None:
        now = time.monotonic()
        at = self._connect_at
        if early is not None:
            at = min(at, max(early, self._floor_until))  # a retry delay asked for is kept
        if at >= deadline:
            raise CallError(
                "unreachable",
                f"no task of the position answered; backing off after {self.failures} "
                f"failures in a row (last problem: {self._problem})"
                if self._problem
                else f"no task of the position answered; backing off after {self.failures} "
                "failures in a row",
            )
        if now < at and self._interrupted.wait(at - now):
            self._check_interrupted()
        self.connects += 1
        timeout = max(0.001, min(self._connect_timeout, deadline - time.monotonic()))
        try:
            host, port = parse_address(self._current)  # a master named by a server: hostile
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_name or host)
        except (OSError, ssl.SSLError, ValueError) as e:  # ValueError: not host:port, or no name
            self._fail(f"cannot connect to {self._current}: {e}", move=True)
            raise CallError("unreachable", f"cannot connect to {self._current}: {e}") from None
        self._sock = sock
        self._buffer = b""

    # ---- one exchange --------------------------------------------------------------------

    def _exchange(self, method: str, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        assert self._sock is not None
        self._id += 1
        request_id = self._id
        try:
            self._sock.settimeout(max(0.001, deadline - time.monotonic()))
            self._sock.sendall(_wire.request_line(request_id, method, params))
            while True:
                line = self._read_line(deadline)
                answer = self._parse(line)
                if answer.get("id") == request_id:
                    break
                if answer.get("id") is None and "error" in answer:
                    self._refused(answer)  # a node over its limits: closes after this
        except socket.timeout:
            self._check_interrupted()
            raise CallError("timed_out", f"{self._current} did not answer {method} in time")
        except (OSError, ssl.SSLError) as e:
            self._check_interrupted()
            self._fail(f"connection to {self._current} lost: {e}", move=True)
            raise CallError("unreachable", f"connection lost: {e}") from None
        self.failures = 0
        self._round_failures = 0
        self._retry_after = 0.0
        if "error" in answer:
            err = answer["error"]
            code = err.get("code") if isinstance(err, dict) else None
            message = err.get("message") if isinstance(err, dict) else None
            raise CallError(
                "error_answer",
                message if isinstance(message, str) else "an error answer",
                code if isinstance(code, int) and not isinstance(code, bool) else 0,
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise CallError("bad_answer", "result: must be an object")
        return result

    def _read_line(self, deadline: float) -> bytes:
        assert self._sock is not None
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_ANSWER_BYTES:
                raise OSError("an answer longer than 1 MiB")
            left = deadline - time.monotonic()
            if left <= 0:  # a peer trickling bytes without a newline ends at the deadline too
                raise socket.timeout("deadline passed")
            self._sock.settimeout(left)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise OSError("closed by the server")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _parse(self, line: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise OSError("an answer that is not JSON (or nested too deep)") from None
        if not isinstance(answer, dict):
            raise OSError("an answer that is not an object")
        return answer

    def _refused(self, answer: dict[str, Any]) -> None:
        err = answer.get("error")
        data = err.get("data") if isinstance(err, dict) else None
        hint = data.get("retry_after") if isinstance(data, dict) else None
        if isinstance(hint, (int, float)) and not isinstance(hint, bool) and 0 < hint <= 300:
            self._retry_after = float(hint)
        raise OSError(refusal_text(err, self._retry_after))
