"""A protected service for docs/learned-capacity.md: `GET /call` is answered 200 while the
calls fit its capacity (a token bucket holding a tenth of a second of it), and `429 Too Many
Requests` with `Retry-After: 1` above it. Its capacity changes at run time:
`POST /capacity` with `{"capacity": N}` (N a number from 0 to 1e6; else 400 naming the field).
`GET /seconds` gives its own record, one entry a second since it started:
`[[unix_second, capacity, served, overloaded], ...]` (the last 3600 at most).

    /usr/bin/python3 examples/learned_capacity/backend.py --capacity 300 [--listen 127.0.0.1:0]

It prints `listening on HOST:PORT` once it answers. The standard library only."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
import time
from typing import Any


class Service:
    """The bucket and the record, under one lock."""

    def __init__(self, capacity: float) -> None:
        self.lock = threading.Lock()
        self.capacity = capacity
        self.tokens = capacity / 10
        self.filled = time.monotonic()
        self.record: dict[int, list[float]] = {}  # unix second -> [capacity, served, overloaded]

    def call(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.capacity / 10, self.tokens + self.capacity * (now - self.filled))
            self.filled = now
            ok = self.tokens >= 1
            if ok:
                self.tokens -= 1
            second = self.record.setdefault(int(time.time()), [self.capacity, 0, 0])
            second[1 if ok else 2] += 1
            if len(self.record) > 3600:
                del self.record[min(self.record)]
            return ok

    def set_capacity(self, capacity: float) -> None:
        with self.lock:
            self.capacity = capacity
            self.tokens = min(self.tokens, capacity / 10)

    def seconds(self) -> list[list[float]]:
        with self.lock:
            return [[t] + v for t, v in sorted(self.record.items())]


def handler(service: Service) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, code: int, body: Any, headers: tuple[tuple[str, str], ...] = ()) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802: http.server's name
            if self.path == "/call":
                if service.call():
                    self.answer(200, {"ok": True})
                else:
                    self.answer(429, {"error": "over capacity"}, (("Retry-After", "1"),))
            elif self.path == "/seconds":
                self.answer(200, service.seconds())
            else:
                self.answer(404, {"error": f"no such path: {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/capacity":
                return self.answer(404, {"error": f"no such path: {self.path}"})
            try:
                n = int(self.headers.get("Content-Length", "0"))
                if not 0 <= n <= 4096:
                    raise ValueError("Content-Length: must be between 0 and 4096")
                body = json.loads(self.rfile.read(n) or b"null")
                capacity = body.get("capacity") if isinstance(body, dict) else None
                if isinstance(capacity, bool) or not isinstance(capacity, (int, float)) \
                        or not 0 <= capacity <= 1e6:
                    raise ValueError("capacity: must be a number from 0 to 1e6")
            except ValueError as e:
                return self.answer(400, {"error": str(e)})
            service.set_capacity(float(capacity))
            self.answer(200, {"capacity": capacity})

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=float, default=300, help="calls a second, 0 to 1e6")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free one)")
    a = p.parse_args()
    if not 0 <= a.capacity <= 1e6:
        p.error("--capacity: must be between 0 and 1e6")
    host, _, port = a.listen.rpartition(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), handler(Service(a.capacity)))
    server.daemon_threads = True
    print(f"listening on {host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
