"""Envoy's rate limit service on a real doorman-rls, called from Python.

The client is what a Python user of the service has on Debian: python3-grpcio and
python3-protobuf, with message classes made by `protoc --python_out` from proto/envoy/ and the
method called by its path (Debian's grpc-tools is too old to make service stubs).

    /usr/bin/python3 tests/python/rls_client_test.py --rls BIN --node BIN --cli BIN --source DIR

Each test starts its own processes on free ports and waits on their output with a deadline.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def make_stubs(source, out):
    """Python message classes for proto/envoy/ (rls_pb2 and the files it imports) in `out`."""
    protos = os.path.join(source, "proto", "envoy")
    names = ["rls", "envoy_common", "envoy_types", "envoy_header"]
    subprocess.run(
        ["protoc", "--python_out=" + out, "-I", protos, "-I", "/usr/include"]
        + [os.path.join(protos, n + ".proto") for n in names],
        check=True,
    )
    sys.path.insert(0, out)


class Process:
    """A child process whose stderr goes to a log file; lines are awaited with a deadline."""

    def __init__(self, args, log):
        self.log_path = log
        self.scanned = 0
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(args, stderr=f, stdout=subprocess.DEVNULL)

    def wait_for(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                content = f.read()
            while True:
                nl = content.find("\n", self.scanned)
                if nl < 0:
                    break
                line = content[self.scanned : nl]
                self.scanned = nl + 1
                if text in line:
                    return line
            if time.monotonic() >= deadline or self.proc.poll() is not None:
                raise AssertionError("no line with %r in %s:\n%s" % (text, self.log_path, content))
            time.sleep(0.01)  # polling period

    def listening_address(self):
        line = self.wait_for("listening on ")
        return line[line.rindex(" ") + 1 :]

    def stop(self):
        """SIGTERM; the exit status (0: a graceful stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Service:
    """A doorman-rls on a free port over a directory holding tests/rls/edge.yaml."""

    def __init__(self, work, flags=()):
        import grpc
        import rls_pb2

        self.config = os.path.join(work, "config")
        os.makedirs(self.config)
        shutil.copy(os.path.join(ARGS.source, "tests", "rls", "edge.yaml"), self.config)
        self.process = Process(
            [ARGS.rls, "--listen", "127.0.0.1:0", "--config", self.config,
             "--reload-interval", "0.05", *flags],
            os.path.join(work, "rls.log"),
        )
        self.address = self.process.listening_address()
        self.channel = grpc.insecure_channel(self.address)
        self.call = self.channel.unary_unary(
            METHOD,
            request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )

    def ask(self, request):
        return self.call(request, timeout=5)

    def close(self):
        self.channel.close()
        return self.process.stop()


def request(descriptors, domain="edge", hits=0):
    import rls_pb2

    r = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for entries in descriptors:
        d = r.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return r


class RateLimitServiceTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="doorman-rls-python-")
        self.services = []

    def tearDown(self):
        for s in self.services:
            self.assertEqual(s.close(), 0)
        shutil.rmtree(self.work)

    def service(self, name, flags=()):
        s = Service(os.path.join(self.work, name), flags)
        self.services.append(s)
        return s

    def test_codes_remaining_resets_and_hits_addend(self):
        import rls_pb2

        R = rls_pb2.RateLimitResponse
        s = self.service("codes")
        ip = request([[("remote_address", "1.2.3.4")]])
        for left in (2, 1, 0):
            a = s.ask(ip)
            self.assertEqual(a.overall_code, R.OK)
            st = a.statuses[0]
            self.assertEqual(st.code, R.OK)
            self.assertEqual(st.limit_remaining, left)
            self.assertEqual(st.current_limit.requests_per_unit, 3)
            self.assertEqual(st.current_limit.unit, R.RateLimit.MINUTE)
            self.assertEqual(st.current_limit.name, "per-ip")
            self.assertLessEqual(st.duration_until_reset.seconds, 60)
        over = s.ask(ip)
        self.assertEqual(over.overall_code, R.OVER_LIMIT)
        self.assertEqual(over.statuses[0].code, R.OVER_LIMIT)
        self.assertEqual(over.statuses[0].limit_remaining, 0)
        # hits_addend: the request's, then a descriptor's own.
        a = s.ask(request([[("remote_address", "5.6.7.8")]], hits=2))
        self.assertEqual(a.statuses[0].limit_remaining, 1)
        r = request([[("remote_address", "5.6.7.9")]], hits=2)
        r.descriptors[0].hits_addend.value = 3
        self.assertEqual(s.ask(r).statuses[0].limit_remaining, 0)
        self.assertEqual(s.ask(r).overall_code, R.OVER_LIMIT)
        # Several descriptors: over when one is, a status for each.
        two = s.ask(request([[("remote_address", "1.2.3.4")], [("path", "/api/x")]]))
        self.assertEqual(two.overall_code, R.OVER_LIMIT)
        self.assertEqual([x.code for x in two.statuses], [R.OVER_LIMIT, R.OK])

    def test_unlimited_wildcards_replaces_and_shadow_mode(self):
        import rls_pb2

        R = rls_pb2.RateLimitResponse
        s = self.service("rules")
        for _ in range(5):
            a = s.ask(request([[("remote_address", "10.0.0.9")]]))
            self.assertEqual(a.overall_code, R.OK)
            self.assertEqual(a.statuses[0].limit_remaining, 2**32 - 1)
            self.assertFalse(a.statuses[0].HasField("current_limit"))
        self.assertEqual(s.ask(request([[("path", "/api/a")]])).overall_code, R.OK)
        self.assertEqual(s.ask(request([[("path", "/api/a")]])).overall_code, R.OVER_LIMIT)
        self.assertEqual(s.ask(request([[("path", "/api/b")]])).overall_code, R.OK)
        a = s.ask(request([[("path", "/static/a")]]))
        self.assertFalse(a.statuses[0].HasField("current_limit"))
        # The vip rule replaces per-ip: per-ip is neither reported nor counted.
        vip = s.ask(request([[("remote_address", "7.7.7.7")],
                             [("plan", "vip"), ("remote_address", "7.7.7.7")]]))
        self.assertFalse(vip.statuses[0].HasField("current_limit"))
        self.assertEqual(vip.statuses[1].current_limit.requests_per_unit, 10)
        a = s.ask(request([[("remote_address", "7.7.7.7")]]))
        self.assertEqual(a.statuses[0].limit_remaining, 2)
        # shadow_mode: over its limit (0 an hour), yet OK.
        beta = s.ask(request([[("beta", "on")]]))
        self.assertEqual((beta.overall_code, beta.statuses[0].code), (R.OK, R.OK))

    def test_response_headers(self):
        s = self.service("headers", ["--response-headers",
                                     "--header-remaining", "X-RateLimit-Remaining"])
        s.ask(request([[("remote_address", "9.9.9.9")]]))
        a = s.ask(request([[("remote_address", "9.9.9.9")], [("path", "/api/h")]]))
        headers = {h.key: h.value for h in a.response_headers_to_add}
        self.assertEqual(headers["RateLimit-Limit"], "1")
        self.assertEqual(headers["X-RateLimit-Remaining"], "0")
        self.assertIn("RateLimit-Reset", headers)

    def test_invalid_argument_names_the_field(self):
        import grpc

        s = self.service("bounds")
        with self.assertRaises(grpc.RpcError) as e:
            s.ask(request([[("remote_address", "1.1.1.1")]], domain=""))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(e.exception.details(), "domain: must not be empty")
        with self.assertRaises(grpc.RpcError) as e:
            s.ask(request([[("", "x")]]))
        self.assertEqual(e.exception.details(),
                         "descriptors[0].entries[0].key: must not be empty")

    def test_reload_refuses_a_bad_file_and_keeps_the_rules(self):
        s = self.service("reload")
        path = os.path.join(s.config, "edge.yaml")

        def replace(text):
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.rename(path + ".tmp", path)

        replace("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n"
                "      unit: fortnight\n      requests_per_unit: 1\n")
        refused = s.process.wait_for("configuration rejected")
        for part in ("edge.yaml", "line 5", "descriptors[0].rate_limit.unit"):
            self.assertIn(part, refused)
        a = s.ask(request([[("remote_address", "3.3.3.3")]]))
        self.assertEqual(a.statuses[0].limit_remaining, 2)
        replace("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n"
                "      unit: hour\n      requests_per_unit: 100\n")
        s.process.wait_for("configuration reloaded")
        a = s.ask(request([[("remote_address", "3.3.3.3")]]))
        self.assertEqual(a.statuses[0].current_limit.requests_per_unit, 100)

    def test_metrics_per_rule_as_ratelimit_counts(self):
        import urllib.request

        s = self.service("metrics", ["--metrics-listen", "127.0.0.1:0"])
        with open(s.process.log_path) as f:
            line = next(x for x in f if "metrics on " in x)
        url = line[line.index("http://") :].strip()
        for _ in range(4):  # per-ip allows 3 a minute
            s.ask(request([[("remote_address", "1.2.3.4")]]))
        s.ask(request([[("beta", "on")]]))  # a shadow rule with a limit of 0
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        samples = {}
        for x in text.splitlines():
            if x and not x.startswith("#"):
                name, value = x.rsplit(" ", 1)
                samples[name] = float(value)
        per_ip = '{domain="edge",rule="edge/remote_address=*"}'
        beta = '{domain="edge",rule="edge/beta=*"}'
        self.assertEqual(samples["doorman_rls_hits_total" + per_ip], 4)
        self.assertEqual(samples["doorman_rls_within_limit_total" + per_ip], 3)
        self.assertEqual(samples["doorman_rls_over_limit_total" + per_ip], 1)
        self.assertEqual(samples["doorman_rls_near_limit_total" + per_ip], 1)  # past 80% of 3
        self.assertEqual(samples["doorman_rls_shadow_mode_total" + per_ip], 0)
        self.assertEqual(samples["doorman_rls_shadow_mode_total" + beta], 1)
        self.assertEqual(samples["doorman_rls_over_limit_total" + beta], 1)
        promtool = shutil.which("promtool")
        if promtool:
            checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                     capture_output=True)
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)

    def test_two_replicas_share_one_limit_through_a_real_tree(self):
        import grpc
        import rls_pb2

        config = os.path.join(self.work, "shared")
        os.makedirs(config)
        with open(os.path.join(config, "shared.yaml"), "w") as f:
            f.write("domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit:\n"
                    "      unit: minute\n      requests_per_unit: 20\n")
        # The root's configuration from the same files.
        root_config = json.loads(subprocess.run(
            [ARGS.rls, "--config", config, "--print-root-config"],
            capture_output=True, check=True, text=True).stdout)
        root_json = os.path.join(self.work, "root.json")
        with open(root_json, "w") as f:
            json.dump(root_config, f)
        root = Process([ARGS.node, "--listen", "127.0.0.1:0", "--admin", "off", "--config",
                        root_json, "--minimum-refresh-interval", "0"],
                       os.path.join(self.work, "root.log"))
        try:
            root_at = root.listening_address()
            calls = []
            replicas = []
            for i in range(2):
                p = Process([ARGS.rls, "--listen", "127.0.0.1:0", "--config", config,
                             "--server", root_at],
                            os.path.join(self.work, "rls-%d.log" % i))
                replicas.append(p)
                channel = grpc.insecure_channel(p.listening_address())
                calls.append(channel.unary_unary(
                    METHOD,
                    request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
                    response_deserializer=rls_pb2.RateLimitResponse.FromString))
            r = request([[("tenant", "t1")]], domain="shared")

            def ask(i):
                a = calls[i](r, timeout=5)
                return a.overall_code == rls_pb2.RateLimitResponse.OK

            # All that follows must fall in one window of the rule (a minute of the monotonic
            # clock, which the replicas on this machine share): with less than 20 s of it
            # left, the next.
            in_window = time.monotonic() % 60
            if in_window > 40:
                time.sleep(60 - in_window)  # until the next window
            # 10 asks a second at each for 6 s, within one window (a minute): alone, each would
            # admit 20; drawn from the root's count, they admit exactly 20 together.
            each = [0, 0]
            start = time.monotonic()
            k = 0
            while time.monotonic() < start + 6:
                time.sleep(max(0.0, start + k * 0.1 - time.monotonic()))  # the traffic
                for i in (0, 1):
                    each[i] += int(ask(i))
                k += 1
            self.assertEqual(sum(each), 20)
            self.assertGreaterEqual(min(each), 5)
            for p in replicas:
                self.assertEqual(p.stop(), 0)
        finally:
            self.assertEqual(root.stop(), 0)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    for flag in ("--rls", "--node", "--cli", "--source"):
        parser.add_argument(flag, required=True)
    ARGS, rest = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="doorman-rls-stubs-") as stubs:
        make_stubs(ARGS.source, stubs)
        unittest.main(argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
