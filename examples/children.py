"""What the examples' Python runners share: the binaries, the environment and the log folder
of a run, and a child process whose output goes to a log file, whose address is what it says
it listens on. The standard library only."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
import tempfile
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def prepare(p: argparse.ArgumentParser, folder: str, prefix: str,
            config: dict[str, Any]) -> tuple[str, str, dict[str, str], str]:
    """doorman-node and doorman in `folder` (else `p.error`), the environment of the Python
    children (this repository's python/ when the package is not installed), and a new log
    folder named from `prefix` holding `config` as resources.json."""
    node, cli = os.path.join(folder, "doorman-node"), os.path.join(folder, "doorman")
    for b in (node, cli):
        if not os.access(b, os.X_OK):
            p.error(f"--bin: no executable {b}")
    env = dict(os.environ)
    try:
        import doorman  # noqa: F401  (installed)
    except ImportError:
        env["PYTHONPATH"] = os.path.join(HERE, "..", "python")
    logs = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(logs, "resources.json"), "w") as f:
        json.dump(config, f)
    return node, cli, env, logs


class Process:
    """A child whose output goes to a log file; it has started once its log matches `ready`,
    and `address` is the pattern's group (what a doorman process says it listens on)."""

    def __init__(self, name: str, argv: list[str], logs: str, env: Optional[dict[str, str]] = None,
                 ready: str = r"listening on (\S+)") -> None:
        self.name = name
        self.log_path = os.path.join(logs, name + ".log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            m = re.search(ready, self.log())
            if m:
                self.address = m.group(1) if m.groups() else ""
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start:\n{self.log()}")
            time.sleep(0.05)  # polling its log for the address

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
