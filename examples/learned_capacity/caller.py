"""One client of docs/learned-capacity.md's example: calls the backend (backend.py) as fast as
its doorman rate handle on `backend` admits, through the urllib helper, which waits for each
permit and records each answer (a 429 as overloaded) for the capacity the root learns.

    /usr/bin/python3 examples/learned_capacity/caller.py --doorman HOST:PORT
        --backend http://HOST:PORT --wants 200 --name c1

It prints `listening on -` once its client is up (for the runner), then at exit one line: its
calls, the overloaded ones and its last capacity. SIGTERM ends it. The standard library and the
doorman Python package only."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import urllib.error
import urllib.request

try:
    import doorman
    import doorman.http
except ImportError:  # this repository's python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    import doorman
    import doorman.http


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doorman", required=True,
                   help="the node's HOST:PORT, or its position's tasks: HOST:PORT,HOST:PORT")
    p.add_argument("--backend", required=True, help="the backend's http://HOST:PORT")
    p.add_argument("--wants", type=float, default=200, help="calls a second it asks for")
    p.add_argument("--name", default="caller")
    a = p.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    calls = overloaded = 0
    with doorman.Client(a.doorman.split(","), client_id=a.name,
                        minimum_refresh_interval=0.5) as client:
        backend = client.rate("backend", wants=a.wants)
        opener = urllib.request.build_opener(doorman.http.ThrottlingHandler(backend, timeout=1))
        print("listening on -", flush=True)
        while not stop.is_set():
            try:
                with opener.open(a.backend + "/call", timeout=5) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                e.read()
                overloaded += e.code == 429
            except (TimeoutError, OSError):
                continue  # no permit within a second (capacity 0), or the backend away
            calls += 1
        print(f"{a.name}: {calls} calls, {overloaded} overloaded, capacity {backend.capacity:.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
