"""The gRPC interceptor against a real doorman-node and a real grpcio server: calls wait for
their permits, and each answer is recorded, RESOURCE_EXHAUSTED and UNAVAILABLE as overloaded."""

from __future__ import annotations

import os
import sys
import time
import unittest
from concurrent import futures

import grpc  # type: ignore

sys.path.insert(0, os.path.dirname(__file__))
if os.environ.get("DOORMAN_PYTHON_SOURCE"):  # else: the installed package (the wheel)
    sys.path.insert(0, os.environ["DOORMAN_PYTHON_SOURCE"])

import doorman  # noqa: E402
import doorman.grpc  # noqa: E402
from support import Node, config, docs_example, eventually, run_docs_example  # noqa: E402

METHOD = "/test.Provider/Call"


def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
    """b"ok" answers; b"busy" and b"down" are refused as an overloaded service refuses."""
    if request == b"busy":
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota")
    if request == b"down":
        context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
    if request == b"wrong":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")
    if request == b"slow":  # a service answering late (its latency, not a synchronization)
        time.sleep(0.3)
    return b"ok:" + request


class GrpcInterceptorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.node = Node(config(1000))
        cls.client = doorman.Client(cls.node.address, minimum_refresh_interval=0.1)
        cls.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(answer)
        cls.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Provider", {"Call": handler}),))
        cls.port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop(None)
        cls.client.close()
        cls.node.stop()

    def channel(self, name: str, per_second: float) -> tuple[doorman.RateResource, grpc.Channel]:
        api = self.client.rate(name, wants=per_second, burst=1)
        self.assertTrue(eventually(lambda: api.capacity == per_second))
        channel = grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{self.port}"),
                                         doorman.grpc.ThrottlingInterceptor(api))
        return api, channel

    def test_calls_wait_for_their_permits_and_their_answers_are_recorded(self) -> None:
        api, channel = self.channel("grpc-provider", 10)
        call = channel.unary_unary(METHOD)
        start = time.monotonic()
        for i in range(6):
            self.assertEqual(call(b"%d" % i, timeout=5), b"ok:%d" % i)
        # 10 a second with a burst of 1: six calls span at least 0.5 s.
        self.assertGreaterEqual(time.monotonic() - start, 0.45)
        for refused, code in ((b"busy", grpc.StatusCode.RESOURCE_EXHAUSTED),
                              (b"down", grpc.StatusCode.UNAVAILABLE),
                              (b"wrong", grpc.StatusCode.INVALID_ARGUMENT)):
            with self.assertRaises(grpc.RpcError) as e:
                call(refused, timeout=5)
            self.assertEqual(e.exception.code(), code)
        # A future's answer is recorded when it comes.
        self.assertEqual(call.future(b"f", timeout=5).result(), b"ok:f")
        self.assertTrue(eventually(lambda: api._e.answers == 10))
        self.assertEqual((api._e.answers, api._e.overloads), (10, 2))
        channel.close()

    def test_a_call_that_finds_no_permit_in_time_is_not_made(self) -> None:
        api = self.client.rate("grpc-none", wants=0, burst=1)
        channel = grpc.intercept_channel(
            grpc.insecure_channel(f"127.0.0.1:{self.port}"),
            doorman.grpc.ThrottlingInterceptor(api, timeout=0.2))
        with self.assertRaises(TimeoutError):
            channel.unary_unary(METHOD)(b"x", timeout=5)
        self.assertEqual(api._e.answers, 0)
        channel.close()

    def test_a_call_answered_past_the_latency_target_is_recorded_overloaded(self) -> None:
        api = self.client.rate("grpc-slow", wants=100, burst=1)
        with self.assertRaises(ValueError) as e:
            doorman.grpc.ThrottlingInterceptor(api, latency_target=0)
        self.assertIn("latency_target", str(e.exception))
        channel = grpc.intercept_channel(
            grpc.insecure_channel(f"127.0.0.1:{self.port}"),
            doorman.grpc.ThrottlingInterceptor(api, timeout=5, latency_target=0.2))
        call = channel.unary_unary(METHOD)
        self.assertEqual(call(b"fast", timeout=5), b"ok:fast")
        self.assertEqual(call(b"slow", timeout=5), b"ok:slow")  # 0.3 s: past 0.2 s
        self.assertTrue(eventually(lambda: api._e.answers == 2))
        self.assertEqual((api._e.answers, api._e.overloads), (2, 1))
        channel.close()

    def test_the_grpc_example_of_docs_python_md(self) -> None:
        self.assertIn("doorman.grpc.ThrottlingInterceptor", docs_example(4))
        scope = run_docs_example(4, {"doorman": doorman, "client": self.client, "grpc": grpc})
        self.assertEqual(scope["provider"].id, "model-provider")
        scope["channel"].close()
        scope["provider"].close()

    def test_overloaded_codes(self) -> None:
        self.assertTrue(doorman.grpc.overloaded(grpc.StatusCode.RESOURCE_EXHAUSTED))
        self.assertTrue(doorman.grpc.overloaded(grpc.StatusCode.UNAVAILABLE))
        self.assertTrue(doorman.grpc.overloaded(8))
        self.assertTrue(doorman.grpc.overloaded(14))
        self.assertFalse(doorman.grpc.overloaded(grpc.StatusCode.OK))
        self.assertFalse(doorman.grpc.overloaded(grpc.StatusCode.DEADLINE_EXCEEDED))
        self.assertFalse(doorman.grpc.overloaded(True))
        self.assertFalse(doorman.grpc.overloaded("8"))


if __name__ == "__main__":
    unittest.main()
