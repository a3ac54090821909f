"""The HTTP helpers against a real doorman-node: outgoing calls throttled (a decorator, a
urllib handler against a real local HTTP server, a requests-like session), 429 with
Retry-After from WSGI and ASGI middleware."""

from __future__ import annotations

import asyncio
import http.server
import os
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

import doorman  # noqa: E402
import doorman.http  # noqa: E402
from support import (Node, budget_config, config, docs_example,  # noqa: E402
                     eventually, run_docs_example)


class HttpHelpersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.node = Node(config(1000))
        cls.client = doorman.Client(cls.node.address, minimum_refresh_interval=0.1)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        cls.node.stop()

    def rate(self, name: str, per_second: float) -> doorman.RateResource:
        r = self.client.rate(name, wants=per_second, burst=1)
        self.assertTrue(eventually(lambda: r.capacity == per_second))
        return r

    def test_a_decorated_function_waits_for_its_permit(self) -> None:
        api = self.rate("decorated", 10)
        calls = []

        @doorman.http.throttled(api)
        def fetch(i: int) -> int:
            calls.append(time.monotonic())
            return i

        start = time.monotonic()
        self.assertEqual([fetch(i) for i in range(6)], list(range(6)))
        # 10 a second with a burst of 1: six calls span at least 0.5 s.
        self.assertGreaterEqual(time.monotonic() - start, 0.45)
        self.assertEqual(fetch.__name__, "fetch")

    def test_urllib_requests_wait_for_their_permits(self) -> None:
        seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802: http.server's name
                seen.append(self.path)
                if self.path == "/slow":  # a service answering late (its latency)
                    time.sleep(0.3)
                if self.path == "/spent":  # served, the provider's quota now at 0
                    self.send_response(200)
                    self.send_header("X-RateLimit-Remaining", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/busy":
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            api = self.rate("urllib", 10)
            opener = urllib.request.build_opener(doorman.http.ThrottlingHandler(api))
            start = time.monotonic()
            for i in range(6):
                with opener.open(f"http://127.0.0.1:{server.server_port}/{i}", timeout=5) as r:
                    self.assertEqual(r.read(), b"ok")
            self.assertGreaterEqual(time.monotonic() - start, 0.45)
            self.assertEqual(seen, [f"/{i}" for i in range(6)])
            # Every answer is recorded for a learned capacity; a 429 as overloaded.
            with self.assertRaises(urllib.error.HTTPError):
                opener.open(f"http://127.0.0.1:{server.server_port}/busy", timeout=5)
            self.assertEqual((api._e.answers, api._e.overloads), (7, 1))
            with opener.open(f"http://127.0.0.1:{server.server_port}/spent", timeout=5) as r:
                r.read()
            self.assertEqual((api._e.answers, api._e.overloads), (8, 2))
            # With a latency target, an answer that came late is overloaded too.
            with self.assertRaises(ValueError) as e:
                doorman.http.ThrottlingHandler(api, latency_target=-1)
            self.assertIn("latency_target", str(e.exception))
            late = urllib.request.build_opener(
                doorman.http.ThrottlingHandler(api, latency_target=0.2))
            for path in ("fast", "slow"):  # 0.3 s: past 0.2 s
                with late.open(f"http://127.0.0.1:{server.server_port}/{path}", timeout=5) as r:
                    self.assertEqual(r.read(), b"ok")
            self.assertEqual((api._e.answers, api._e.overloads), (10, 3))
        finally:
            server.shutdown()
            server.server_close()

    def test_the_latency_target_example_of_docs_learned_capacity_md(self) -> None:
        self.assertIn("latency_target=0.5", docs_example(0, "learned-capacity.md"))
        scope = run_docs_example(0, {"doorman": doorman, "client": self.client,
                                     "urllib": urllib}, "learned-capacity.md")
        handler = next(h for h in scope["opener"].handlers
                       if isinstance(h, doorman.http.ThrottlingHandler))
        self.assertEqual((handler.resource.id, handler.latency_target), ("provider", 0.5))
        scope["provider"].close()

    def test_what_says_overloaded(self) -> None:
        o = doorman.http.overloaded
        self.assertTrue(o(429) and o(503))
        self.assertFalse(o(200, {}) or o(500, {}))
        self.assertTrue(o(200, {"Retry-After": "3"}))
        for name in ("X-RateLimit-Remaining", "ratelimit-remaining",
                     "x-ratelimit-remaining-tokens", "anthropic-ratelimit-requests-remaining"):
            self.assertTrue(o(200, {name: "0"}), name)
            self.assertTrue(o(200, {name: "-1, 5"}), name)  # joined values: the first
            self.assertFalse(o(200, {name: "12"}), name)
            for hostile in ("", "none", "nan", "0x0", "1e999x"):
                self.assertFalse(o(200, {name: hostile}), (name, hostile))
        self.assertFalse(o(200, {"X-RateLimit-Limit": "0"}))  # the limit, not what is left
        self.assertTrue(doorman.http.quota_spent([("x-ratelimit-remaining", "0")]))
        self.assertFalse(doorman.http.quota_spent(None))
        self.assertFalse(doorman.http.quota_spent(42))

    def test_a_session_waits_for_its_permits(self) -> None:
        class Session:  # what requests.Session and urllib3.PoolManager offer
            def __init__(self) -> None:
                self.sent: list[tuple[str, str]] = []

            def request(self, method: str, url: str, **kwargs: object) -> str:
                self.sent.append((method, url))
                return "response"

        api = self.rate("session", 10)
        s = doorman.http.throttle_session(Session(), api)
        start = time.monotonic()
        for i in range(6):
            self.assertEqual(s.request("GET", f"http://x/{i}"), "response")
        self.assertGreaterEqual(time.monotonic() - start, 0.45)
        self.assertEqual(len(s.sent), 6)

    def test_a_session_records_each_answer(self) -> None:
        class Response:
            def __init__(self, status: int, headers: dict[str, str]) -> None:
                self.status_code, self.headers = status, headers

        class Session:
            def request(self, method: str, url: str, **kwargs: object) -> Response:
                if url.endswith("/slow"):  # a service answering late (its latency)
                    time.sleep(0.3)
                if url.endswith("/spent"):
                    return Response(200, {"x-ratelimit-remaining-requests": "0"})
                return Response(429 if url.endswith("/busy") else 200, {})

        api = self.rate("session-answers", 100)
        with self.assertRaises(ValueError):
            doorman.http.throttle_session(Session(), api, latency_target=float("nan"))
        s = doorman.http.throttle_session(Session(), api, latency_target=0.2)
        for path in ("ok", "busy", "spent", "slow"):
            s.request("GET", f"http://x/{path}")
        self.assertEqual((api._e.answers, api._e.overloads), (4, 3))

    def test_wsgi_answers_429_with_retry_after(self) -> None:
        inbound = self.rate("wsgi", 0.5)  # one every 2 s, a burst of 1

        def app(environ: dict, start_response):  # type: ignore[no-untyped-def]
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"hello\n"]

        limited = doorman.http.WsgiLimit(app, inbound)
        answers = []

        def start_response(status: str, headers: list) -> None:  # type: ignore[type-arg]
            answers.append((status, dict(headers)))

        self.assertEqual(b"".join(limited({}, start_response)), b"hello\n")
        self.assertEqual(b"".join(limited({}, start_response)), b"too many requests\n")
        self.assertEqual(answers[0][0], "200 OK")
        self.assertEqual(answers[1][0], "429 Too Many Requests")
        self.assertIn(answers[1][1]["Retry-After"], ("1", "2"))

    def test_asgi_answers_429_with_retry_after(self) -> None:
        inbound = self.rate("asgi", 0.5)
        sent: list[dict] = []  # type: ignore[type-arg]

        async def app(scope, receive, send):  # type: ignore[no-untyped-def]
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"hello"})

        async def send(message: dict) -> None:  # type: ignore[type-arg]
            sent.append(message)

        async def receive() -> dict:  # type: ignore[type-arg]
            return {"type": "http.request"}

        limited = doorman.http.AsgiLimit(app, inbound)
        asyncio.run(limited({"type": "http"}, receive, send))
        asyncio.run(limited({"type": "http"}, receive, send))
        self.assertEqual([m.get("status") for m in sent if "status" in m], [200, 429])
        headers = dict(sent[2]["headers"])
        self.assertIn(headers[b"retry-after"], (b"1", b"2"))
        asyncio.run(limited({"type": "lifespan"}, receive, send))  # passes through
        self.assertEqual(sent[-1]["body"], b"hello")

    def test_wsgi_settles_each_call_at_what_its_response_says_it_used(self) -> None:
        # 10 a second, a burst of 20: a call admitted at 10 that says it used 30 leaves a debt
        # of 10 (the next call is refused); one that says 2 gives 8 back; a header that is not
        # a number >= 0 settles nothing (the call keeps its 10).
        def answering(used: str):  # type: ignore[no-untyped-def]
            def app(environ: dict, start_response):  # type: ignore[no-untyped-def]
                start_response("200 OK", [("Content-Type", "text/plain"), ("X-Used", used)])
                return [b"ok"]
            return app

        def status(app: object) -> str:
            answers: list[str] = []
            b"".join(app({}, lambda st, h: answers.append(st)))  # type: ignore[operator]
            return answers[0]

        for used, second in (("30", "429 Too Many Requests"), ("2", "200 OK"),
                             ("lots", "200 OK"), ("-5", "200 OK"), ("nan", "200 OK")):
            api = self.client.rate(f"wsgi-used-{used}", wants=10, burst=20)
            self.assertTrue(eventually(lambda: api.capacity == 10))
            first = doorman.http.WsgiLimit(answering(used), api, cost=10, used="x-used")
            self.assertEqual(status(first), "200 OK")
            then = doorman.http.WsgiLimit(answering("0"), api, cost=10)
            self.assertEqual(status(then), second, used)

    def test_asgi_settles_from_the_response_start_or_a_function_of_it(self) -> None:
        api = self.client.rate("asgi-used", wants=10, burst=20)
        self.assertTrue(eventually(lambda: api.capacity == 10))
        sent: list[dict] = []  # type: ignore[type-arg]

        async def app(scope, receive, send):  # type: ignore[no-untyped-def]
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"x-tokens", b"30")]})
            await send({"type": "http.response.body", "body": b"hello"})

        async def send(message: dict) -> None:  # type: ignore[type-arg]
            sent.append(message)

        async def receive() -> dict:  # type: ignore[type-arg]
            return {"type": "http.request"}

        seen: list[tuple[int, list[tuple[str, str]]]] = []

        def tokens(status: int, headers: list[tuple[str, str]]) -> float:
            seen.append((status, headers))
            return float(dict(headers)["x-tokens"])

        limited = doorman.http.AsgiLimit(app, api, cost=10, used=tokens)
        asyncio.run(limited({"type": "http"}, receive, send))
        self.assertEqual(seen, [(200, [("x-tokens", "30")])])
        asyncio.run(limited({"type": "http"}, receive, send))  # in debt: refused
        self.assertEqual([m.get("status") for m in sent if "status" in m], [200, 429])
        self.assertEqual(sent[1]["body"], b"hello")  # the app's answer went through whole

    def test_a_budget_behind_the_middleware_settles_and_refuses_with_retry_after_1(self) -> None:
        node = Node(budget_config(100))
        try:
            with doorman.Client(node.address, minimum_refresh_interval=0.1) as c:
                tokens = c.budget("tokens", wants=100)
                self.assertTrue(eventually(lambda: tokens.left == 100))

                def app(environ: dict, start_response):  # type: ignore[no-untyped-def]
                    start_response("200 OK", [("X-Tokens-Used", "70")])
                    return [b"ok"]

                limited = doorman.http.WsgiLimit(app, tokens, cost=40, used="X-Tokens-Used")
                answers: list[tuple[str, dict]] = []  # type: ignore[type-arg]

                def start_response(st: str, h: list) -> None:  # type: ignore[type-arg]
                    answers.append((st, dict(h)))

                b"".join(limited({}, start_response))
                self.assertEqual(tokens.spent, 70)  # settled at what the response said
                b"".join(limited({}, start_response))  # 30 left: 40 is refused
                self.assertEqual(answers[1][0], "429 Too Many Requests")
                self.assertEqual(answers[1][1]["Retry-After"], "1")
        finally:
            node.stop()

    def test_the_http_example_of_docs_python_md(self) -> None:
        self.assertIn("doorman.http.WsgiLimit", docs_example(2))

        def app(environ, start_response):  # type: ignore[no-untyped-def]
            return [b""]

        scope = run_docs_example(2, {"doorman": doorman, "client": self.client, "app": app})
        self.assertIsInstance(scope["app"], doorman.http.WsgiLimit)
        self.assertEqual(scope["inbound"].id, "inbound")  # type: ignore[attr-defined]
        # The gateway's example after it: a budget, settled from the response's header.
        scope = run_docs_example(3, {"doorman": doorman, "client": self.client, "app": app})
        limited: doorman.http.WsgiLimit = scope["app"]  # type: ignore[assignment]
        self.assertIsInstance(limited, doorman.http.WsgiLimit)
        self.assertEqual((limited.cost, limited.used), (2000, "X-Tokens-Used"))
        self.assertEqual(scope["tokens"].id, "tokens-daily")  # type: ignore[attr-defined]
        scope["tokens"].close()  # type: ignore[attr-defined]

    def test_retry_after_is_whole_seconds_rounded_up(self) -> None:
        self.assertEqual(doorman.http.retry_after_seconds(0.2), "1")
        self.assertEqual(doorman.http.retry_after_seconds(2.01), "3")
        self.assertEqual(doorman.http.retry_after_seconds(float("inf")), "1")


if __name__ == "__main__":
    unittest.main()
