"""A stand-in for a model API: POST /v1/complete with {"prompt": str, "max_tokens": int}
answers a completion and says what it used, in its body's "usage" and in the header
X-Tokens-Used (prompt tokens, a quarter of the prompt's characters, plus the completion's
tokens: a heavy tail from 20, never above max_tokens, as a model stops at its max_tokens).
GET /v1/served lists every completion served: [unix time, the X-Gateway header, tokens].

    /usr/bin/python3 model.py [--listen 127.0.0.1:0] [--seed 1]

Prints "listening on HOST:PORT" once it accepts. The standard library only."""

from __future__ import annotations

import argparse
import http.server
import json
import random
import sys
import threading
import time
from typing import Any

MAX_BODY = 1 << 16


class Model:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.served: list[list[Any]] = []

    def complete(self, request: Any, gateway: str) -> dict[str, Any]:
        """The usage of one completion; ValueError naming the field for a bad request."""
        if not isinstance(request, dict):
            raise ValueError("the body must be a JSON object")
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("prompt: must be a string")
        max_tokens = request.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 100000:
            raise ValueError("max_tokens: must be an integer from 1 to 100000")
        with self.lock:
            completion = min(max_tokens, int(20 * self.random.paretovariate(1.2)))
            used = len(prompt) // 4 + completion
            self.served.append([time.time(), gateway, used])
        return {"prompt_tokens": len(prompt) // 4, "completion_tokens": completion,
                "total_tokens": used}


class Handler(http.server.BaseHTTPRequestHandler):
    model: Model

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def answer(self, code: int, body: Any, headers: dict[str, str] = {}) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/v1/served":
            return self.answer(404, {"error": "no such path"})
        with self.model.lock:
            served = list(self.model.served)
        self.answer(200, served)

    def do_POST(self) -> None:
        if self.path != "/v1/complete":
            return self.answer(404, {"error": "no such path"})
        try:
            length = int(self.headers.get("Content-Length", ""))
            if not 0 <= length <= MAX_BODY:
                raise ValueError
        except ValueError:
            return self.answer(400, {"error": f"Content-Length: must be 0 to {MAX_BODY}"},
                               {"X-Tokens-Used": "0"})
        try:
            usage = self.model.complete(json.loads(self.rfile.read(length) or b"null"),
                                        self.headers.get("X-Gateway", ""))
        except ValueError as e:  # json.JSONDecodeError is one
            return self.answer(400, {"error": str(e)}, {"X-Tokens-Used": "0"})
        time.sleep(0.01 + usage["completion_tokens"] / 40000)  # generating
        self.answer(200, {"text": "lorem " * min(usage["completion_tokens"], 64), "usage": usage},
                    {"X-Tokens-Used": str(usage["total_tokens"])})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    host, port = a.listen.rsplit(":", 1)
    Handler.model = Model(a.seed)
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on {host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
