"""Checks the Kubernetes kit against the binaries it runs (ctest doorman.kubernetes_kit).

    /usr/bin/python3 deploy/kubernetes/check_kit.py DOORMAN_NODE DOORMAN_CLI WORK_DIR

For each overlay, renders it with `kubectl kustomize`, then:
  - every DOORMAN_* variable and --flag given to doorman-node is a flag of its --help;
  - ports: the listen, admin and advertised addresses use the container's named ports, and the
    probes and Services name ports that exist; selectors select the pods;
  - files: every /etc/doorman path is under a mounted volume and names a key of its ConfigMap
    (or the Secret keys the docs ask for); the configuration passes `doorman config check`;
  - the grace period covers the drain timeout (twice, for a node with the gRPC door);
  - then runs each position's container as rendered, on this machine: the root first, the
    intermediate below it (its parent the root's address), with the mounted files put in a
    directory (the Secret's from examples/make_certs.sh), the pod IP 127.0.0.1, ports picked
    free and no etcd (each task alone is master); asks each probe's path with the probe's
    scheme (it must answer 200), and waits for the intermediate's link to its parent.
Exits 1 with one line per problem.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

KIT = Path(__file__).resolve().parent
SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # what cert-manager writes (docs/deployment.md)
problems: list[str] = []


def problem(where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def render(overlay: Path) -> list[dict]:
    r = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True,
                       timeout=120)
    # Newer kubectl warns about the fields kept for Debian 12's kubectl 1.20; nothing else.
    others = [line for line in r.stderr.splitlines()
              if line.strip() and "Warning:" not in line and "is deprecated" not in line]
    if r.returncode != 0 or others:
        problem(overlay.name, f"kubectl kustomize failed: {r.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def node_flags(node: str) -> set[str]:
    help_text = subprocess.run([node, "--help"], capture_output=True, text=True,
                               check=True).stdout
    return set(re.findall(r"^  (--[a-z-]+)", help_text, re.M))


def flag_of(variable: str) -> str:
    return "--" + variable.removeprefix("DOORMAN_").lower().replace("_", "-")


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_deployment(where: str, d: dict, docs: list[dict], flags: set[str]) -> None:
    pod = d["spec"]["template"]
    if not labels_match(d["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]):
        problem(where, "the selector does not select the pod template")
    spec = pod["spec"]
    [c] = [c for c in spec["containers"] if c["name"] == "doorman-node"]
    if c.get("command") != ["/usr/bin/doorman-node"]:
        problem(where, f"command {c.get('command')}: the package installs /usr/bin/doorman-node")
    for a in c.get("args", []):
        if a.startswith("--") and a.split("=", 1)[0] not in flags:
            problem(where, f"argument {a} is not a doorman-node flag")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    for name in env:
        if name.startswith("DOORMAN_") and flag_of(name) not in flags:
            problem(where, f"{name} names no flag ({flag_of(name)} is not in --help)")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for variable, port in (("DOORMAN_LISTEN", "rpc"), ("DOORMAN_ADMIN", "admin"),
                           ("DOORMAN_ADVERTISE", "rpc")):
        if variable not in env or port not in ports or port_of(env[variable]) != ports[port]:
            problem(where, f"{variable} ({env.get(variable)}) is not on the port named {port}")
    tls = "DOORMAN_TLS_CERT" in env
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ports:
            problem(where, f"{probe} should ask {path} on a named port, asks {get}")
        if (get.get("scheme") == "HTTPS") != tls:
            problem(where, f"{probe}: the admin endpoint speaks {'HTTPS' if tls else 'HTTP'}")
    drain = float(env.get("DOORMAN_DRAIN_TIMEOUT", 5))
    if spec.get("terminationGracePeriodSeconds", 30) < 2 * drain + 1:
        problem(where, "terminationGracePeriodSeconds is under twice the drain timeout + 1 s")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for name, value in env.items():
        if not (value or "").startswith("/etc/doorman/"):
            continue
        directory, file = os.path.split(value)
        volume = volumes.get(mounts.get(directory, ""))
        if volume is None:
            problem(where, f"{name}={value}: no volume is mounted at {directory}")
        elif "configMap" in volume:
            data = configmap(docs, volume["configMap"]["name"])
            if file not in data:
                problem(where, f"{name}={value}: {file} is not a key of that ConfigMap")
        elif file not in SECRET_KEYS:
            problem(where, f"{name}={value}: {file} is not a key the Secret is said to have")


def configmap(docs: list[dict], name: str) -> dict:
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name:
            return d.get("data", {})
    return {}


def check_selectors(where: str, docs: list[dict]) -> None:
    pods = [d for d in docs if d["kind"] == "Deployment"]
    for d in docs:
        if d["kind"] not in ("Service", "PodDisruptionBudget"):
            continue
        name = f"{where}/{d['kind']}/{d['metadata']['name']}"
        selector = d["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        chosen = [p for p in pods if labels_match(selector, p["spec"]["template"]["metadata"]["labels"])]
        if len(chosen) != 1:
            problem(name, f"selects {len(chosen)} Deployments, not one")
            continue
        if d["kind"] == "Service":
            if d["spec"].get("clusterIP") != "None":
                problem(name, "not headless (clusterIP: None): its name must resolve to the tasks")
            [c] = chosen[0]["spec"]["template"]["spec"]["containers"]
            names = {p["name"] for p in c["ports"]}
            for p in d["spec"]["ports"]:
                if p["targetPort"] not in names:
                    problem(name, f"targetPort {p['targetPort']} is not a container port")


class running:
    """A rendered container run here: its mounted files in `root`, its ports free ones."""

    def __init__(self, node: str, d: dict, docs: list[dict], root: Path, certs: Path,
                 parent: str | None) -> None:
        spec = d["spec"]["template"]["spec"]
        [c] = spec["containers"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin")}
        values = {"POD_IP": "127.0.0.1", "POD_NAME": d["metadata"]["name"] + "-0"}
        for e in c.get("env", []):
            if "value" not in e:
                continue
            value = re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), ""), e["value"])
            values[e["name"]] = value
            if e["name"].startswith("DOORMAN_"):
                env[e["name"]] = value.replace("/etc/doorman/", f"{root}/")
        for variable in ("DOORMAN_LISTEN", "DOORMAN_ADMIN", "DOORMAN_ADVERTISE"):
            env[variable] = "127.0.0.1:0"
        env.pop("DOORMAN_ADVERTISE")
        for variable in ("DOORMAN_ETCD_ENDPOINTS", "DOORMAN_ELECTION_KEY", "DOORMAN_ELECTION_TTL",
                         "DOORMAN_ETCD_TLS_CA"):
            env.pop(variable, None)  # no etcd here: the task is alone
        if parent:
            env["DOORMAN_PARENT"] = parent
            if "DOORMAN_PARENT_TLS_CA" in env:  # the test certificates name localhost
                env["DOORMAN_PARENT_TLS_SERVER_NAME"] = "localhost"
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        root.mkdir(parents=True, exist_ok=True)
        for v in spec.get("volumes", []):
            at = Path(str(mounts[v["name"]]).replace("/etc/doorman", str(root)))
            at.mkdir(parents=True, exist_ok=True)
            if "configMap" in v:
                for key, text in configmap(docs, v["configMap"]["name"]).items():
                    (at / key).write_text(text)
            else:
                for key, source in (("tls.crt", "node.pem"), ("tls.key", "node.key"),
                                    ("ca.crt", "ca.pem")):
                    shutil.copy(certs / source, at / key)
        self.log = root / "node.log"
        self.tls = "DOORMAN_TLS_CERT" in env
        self.probes = [c[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([node], env=env, stdout=log, stderr=log)
        self.address = self.wait_for(r"listening on (\S+)")
        self.admin = self.wait_for(r"admin endpoint on (https?://[^/\s]+)")

    def wait_for(self, pattern: str) -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log.read_text())
            if m:
                return m.group(m.lastindex or 0)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)  # polling the log for the line
        raise RuntimeError(f"no line /{pattern}/ in the node's log:\n{self.log.read_text()}")

    def ask(self, path: str) -> int:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # as the kubelet's probes
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(self.admin + path, timeout=5,
                                            context=context if self.tls else None) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                if time.monotonic() > deadline:
                    return e.code
            time.sleep(0.1)  # a probe's period: ready once the parent answered

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=20)


def run_positions(where: str, node: str, docs: list[dict], work: Path, certs: Path) -> None:
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    nodes: list[running] = []
    try:
        parent = None
        for name in ("doorman-root", "doorman-intermediate"):
            r = running(node, deployments[name], docs, work / where / name, certs, parent)
            nodes.append(r)
            for path in r.probes:
                status = r.ask(path)
                if status != 200:
                    problem(f"{where}/{name}", f"{path} answered {status}:\n{r.log.read_text()}")
            if parent:
                # The link to the parent works: the parent answered (plaintext), or its TLS
                # handshake passed and its access file judged the test certificate's identity,
                # which the kit's file does not list (its identities are to be replaced).
                r.wait_for(r"parent \S+ reached|identity \"spiffe://doorman.test/node/root\" "
                           r"matches no rule of the access file")
            parent = r.address
    except RuntimeError as e:
        problem(where, str(e))
    finally:
        for r in reversed(nodes):
            if r.stop() != 0:
                problem(where, f"{r.log}: did not stop cleanly:\n{r.log.read_text()}")


def main() -> int:
    node, cli, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    certs = work / "certs"
    subprocess.run(["sh", str(KIT.parent.parent / "examples" / "make_certs.sh"), str(certs)],
                   check=True, capture_output=True)
    flags = node_flags(node)
    overlays = sorted(p for p in (KIT / "overlays").iterdir() if p.is_dir())
    for overlay in overlays:
        docs = render(overlay)
        if not docs:
            continue
        kinds = sorted(d["kind"] for d in docs)
        print(f"{overlay.name}: {len(docs)} objects ({', '.join(kinds)})")
        check_selectors(overlay.name, docs)
        for d in docs:
            if d["kind"] == "Deployment":
                check_deployment(f"{overlay.name}/{d['metadata']['name']}", d, docs, flags)
        config = work / overlay.name / "resources.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(configmap(docs, "doorman-config").get("resources.yaml", ""))
        check = subprocess.run([cli, "config", "check", str(config)], capture_output=True,
                               text=True)
        if check.returncode != 0:
            problem(overlay.name, f"doorman config check: {check.stdout}{check.stderr}")
        run_positions(overlay.name, node, docs, work, certs)
    if len(overlays) < 2:
        problem("overlays", f"expected plaintext and tls, found {[o.name for o in overlays]}")
    for p in problems:
        print(p)
    print("kit: ok" if not problems else f"kit: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
