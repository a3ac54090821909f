"""One replica of a gateway in front of a model API. Every replica shares two limits of a
doorman tree, without a network call per request:

- "tokens-per-minute", a rate of tokens a second: the fleet's tokens in any minute;
- "tokens-per-day", a budget of tokens per UTC day.

A request (POST /v1/complete, {"prompt": str, "max_tokens": int}) is admitted at its most
(a quarter of the prompt's characters plus max_tokens) by both, forwarded, and settled at what
the model's answer says it used (X-Tokens-Used): the rest goes back. A request either limit
refuses is answered 429 with Retry-After, and the model is not called.

    /usr/bin/python3 gateway.py --doorman HOST:PORT --model http://HOST:PORT [--name gw-1]
        [--listen 127.0.0.1:0] [--hold 8000]

Prints "listening on HOST:PORT" once it accepts; SIGTERM releases its shares and stops it."""

from __future__ import annotations

import argparse
import io
import json
import signal
import socketserver
import sys
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import doorman
import doorman.http

MAX_BODY = 1 << 16
MOST = 100000  # the most a request may ask for (the model's own bound on max_tokens)


def estimate(environ: dict[str, Any]) -> float:
    """What a request may cost at most, read from its body (kept for the app). A body that
    says nothing usable costs 0: the model refuses it, and nothing is spent."""
    if "gateway.estimate" not in environ:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        body = environ["wsgi.input"].read(length) if 0 <= length <= MAX_BODY else b""
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            r = json.loads(body)
            cost = len(r["prompt"]) // 4 + r["max_tokens"]
            ok = isinstance(r["prompt"], str) and type(r["max_tokens"]) is int
        except (ValueError, KeyError, TypeError):
            ok = False
        environ["gateway.estimate"] = float(cost) if ok and 0 < cost <= 2 * MOST + MAX_BODY else 0.0
    return float(environ["gateway.estimate"])


def tokens_used(status: int, headers: list[tuple[str, str]]) -> Optional[float]:
    """The model's X-Tokens-Used; 0 for a 429 (refused before the model: nothing used). None
    when it says nothing usable: the request keeps its estimate."""
    if status == 429:
        return 0.0
    try:
        return float(next(v for k, v in headers if k.lower() == "x-tokens-used"))
    except (StopIteration, ValueError):
        return None


def proxy(model: str, name: str) -> Callable[..., Iterable[bytes]]:
    """The app: forwards POST /v1/complete to the model, its answer and X-Tokens-Used back."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != "/v1/complete":
            start_response("404 Not Found", [("Content-Type", "text/plain"), ("X-Tokens-Used", "0")])
            return [b"POST /v1/complete\n"]
        estimate(environ)
        body = environ["wsgi.input"].read()
        req = urllib.request.Request(model + "/v1/complete", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Gateway": name})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                code, reason, data, used = r.status, r.reason, r.read(), r.headers.get("X-Tokens-Used")
        except urllib.error.HTTPError as e:
            code, reason, data, used = e.code, e.reason, e.read(), e.headers.get("X-Tokens-Used")
        except OSError:  # the model unreachable: nothing said, the estimate stays spent
            start_response("502 Bad Gateway", [("Content-Type", "text/plain")])
            return [b"the model did not answer\n"]
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        if used is not None:
            headers.append(("X-Tokens-Used", used))
        start_response(f"{code} {reason}", headers)
        return [data]

    return app


class Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doorman", required=True, help="the doorman node (an intermediate)")
    p.add_argument("--model", required=True, help="the model API's base URL")
    p.add_argument("--name", default="gateway")
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--hold", type=float, default=8000,
                   help="tokens of the day to hold (what a replica killed takes with it)")
    a = p.parse_args()
    if not 1 <= a.hold <= 1e12:
        p.error("--hold: must be from 1 to 1e12 tokens")

    client = doorman.Client([a.doorman], client_id=a.name)
    minute = client.rate("tokens-per-minute")   # wants measured from what requests ask
    day = client.budget("tokens-per-day", wants=a.hold)  # units to hold between refreshes
    app = proxy(a.model, a.name)
    app = doorman.http.WsgiLimit(app, day, cost=estimate, used=tokens_used)
    app = doorman.http.WsgiLimit(app, minute, cost=estimate, used=tokens_used)

    host, port = a.listen.rsplit(":", 1)
    server = make_server(host, int(port), app, server_class=Server, handler_class=QuietHandler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    host, port = server.server_address[:2]
    print(f"listening on {host!s}:{port}", flush=True)
    server.serve_forever()
    client.close()  # releases both: the root frees what this replica did not spend
    print(f"{a.name}: spent {day.spent:.0f} tokens of the day", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
