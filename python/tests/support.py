"""Real doorman-node processes on loopback for the Python client's tests, and small fake servers
(one that redirects to another address, one that accepts and never answers)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
from typing import Any, Optional

NODE = os.environ.get("DOORMAN_NODE_BINARY", "build/dev/examples/doorman-node")

# A long run in real time (45 s and more). DOORMAN_PYTHON_LONG_RUNS=0 skips it: the sanitizer
# presets set it. These runs take their time on the clock whatever the build (about 4 minutes
# in all), and test the client's sharing over time, which `make test` runs; the sanitizer presets
# keep every shorter run against real nodes.
long_run = unittest.skipIf(os.environ.get("DOORMAN_PYTHON_LONG_RUNS") == "0",
                           "a long run in real time (DOORMAN_PYTHON_LONG_RUNS=0)")


def config(capacity: float, lease_length: int = 5, refresh_interval: int = 1,
           safe_capacity: Optional[float] = None) -> dict[str, Any]:
    r: dict[str, Any] = {
        "identifier_glob": "*",
        "capacity": capacity,
        "algorithm": {"kind": "FAIR_SHARE", "lease_length": lease_length,
                      "refresh_interval": refresh_interval, "learning_mode_duration": 0},
    }
    if safe_capacity is not None:
        r["safe_capacity"] = safe_capacity
    return {"resources": [r]}


def budget_config(units: float, lease_length: int = 5,
                  window: int | str = 31622400) -> dict[str, Any]:
    """A budget of `units` on "tokens", by default in one fixed window of 366 days (a test does
    not straddle a window's end), and `config(0)` for every other id."""
    budget = {"identifier_glob": "tokens", "capacity": units, "budget": {"window": window},
              "algorithm": {"kind": "FAIR_SHARE", "lease_length": lease_length,
                            "refresh_interval": 1, "learning_mode_duration": 0}}
    return {"resources": [budget] + config(0)["resources"]}


DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")


def docs_example(index: int, doc: str = "python.md") -> str:
    """The `index`-th Python code block of docs/`doc` (from 0), as it is written."""
    with open(os.path.join(DOCS, doc)) as f:
        return f.read().split("```python\n")[index + 1].split("```", 1)[0]


def run_docs_example(index: int, scope: dict[str, Any], doc: str = "python.md") -> dict[str, Any]:
    """Runs the `index`-th Python example of docs/`doc` in `scope`; returns the scope."""
    exec(compile(docs_example(index, doc), os.path.join(DOCS, doc), "exec"),  # noqa: S102
         scope)
    return scope


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Etcd:
    """A real etcd (Debian's etcd-server) on free ports of 127.0.0.1."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="doorman-py-etcd-")
        self.endpoint = "127.0.0.1:%d" % free_port()
        peer = "http://127.0.0.1:%d" % free_port()
        client = "http://" + self.endpoint
        self.log_path = os.path.join(self.dir, "etcd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "doorman-py", "--data-dir", self.dir + "/data",
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "doorman-py=" + peer],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "ready to serve client requests" not in open(self.log_path).read():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("etcd did not start: " + open(self.log_path).read())
            time.sleep(0.05)  # polling the log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


class Node:
    """A doorman-node root on a free port of 127.0.0.1."""

    def __init__(self, conf: dict[str, Any], *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="doorman-py-")
        path = os.path.join(self.dir, "config.json")
        with open(path, "w") as f:
            json.dump(conf, f)
        self.log_path = os.path.join(self.dir, "node.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [NODE, "--listen", "127.0.0.1:0", "--admin", "off", "--config", path,
             "--minimum-refresh-interval", "0", *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.address = self._wait_for(r"listening on (\S+)")

    def _wait_for(self, pattern: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                m = re.search(pattern, f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)  # polling the log
        raise RuntimeError(f"doorman-node did not start: {open(self.log_path).read()}")

    def call(self, method: str, params: dict[str, Any],
             tls: Optional[ssl.SSLContext] = None) -> dict[str, Any]:
        """One JSON-RPC call on a connection of its own (over TLS with `tls`)."""
        host, port = self.address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=5)
        with (tls.wrap_socket(raw, server_hostname=host) if tls else raw) as s:
            s.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                                   "params": params}) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return json.loads(data)

    def leases(self, resource: str) -> dict[str, float]:
        """Client id to capacity of every lease on `resource`."""
        st = self.call("status", {"resource_id": resource})["result"]
        return {l["client_id"]: l["has"]["capacity"] for l in st.get("leases", [])}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL: gone at once, its election lease left to expire."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def is_master(self) -> bool:
        try:
            return bool(self.call("discovery", {})["result"]["mastership"]["is_master"])
        except OSError:
            return False


class FakeServer:
    """Accepts on a free port; `answer(request)` gives the answer object for each request line
    (None: never answers; bytes: sent as they are, for answers no encoder would write)."""

    def __init__(self, answer) -> None:  # type: ignore[no-untyped-def]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._stop = False
        self.refusing = False  # as a restarting node: connections closed as they come
        threading.Thread(target=self._serve, daemon=True).start()

    def refuse(self) -> None:
        """Closes its connections, and every new one at once, until `refusing` is unset."""
        self.refusing = True
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _serve(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.refusing:
                c.close()
                continue
            self._conns.append(c)
            threading.Thread(target=self._talk, args=(c,), daemon=True).start()

    def _talk(self, c: socket.socket) -> None:
        buf = b""
        while True:
            try:
                chunk = c.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                req = json.loads(line)
                self.requests.append(req)
                a = self.answer(req)
                if isinstance(a, bytes):
                    try:
                        c.sendall(a)
                    except OSError:
                        return
                elif a is not None:
                    c.sendall((json.dumps({"jsonrpc": "2.0", "id": req["id"], **a}) + "\n")
                              .encode())

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self._conns:
            c.close()


def free_port_refusing() -> str:
    """An address nothing listens on (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return address


def eventually(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Whether `predicate()` holds before `timeout` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)  # polling period
    return bool(predicate())


class ClosingServer:
    """Accepts every connection and closes it at once (as a node over its connection limit
    does), counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            c.close()

    def close(self) -> None:
        self.sock.close()
