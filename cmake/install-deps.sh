#!/usr/bin/env sh
# Installs doorman's build and test dependencies on Debian/Ubuntu when any is missing.
# Quick (a dpkg query, no network) when everything is already present.
# Runs apt-get as root, or through sudo otherwise.
# `install-deps.sh demo`: only what building and running the demos needs (make demo,
# make tree-demo, make sim); `tools`: the programs (make tools); no argument: everything the
# tests and benchmarks need too.
set -eu

# etcd-server: the high-availability tests start a real etcd (its service need not run).
# libyaml-cpp-dev: Doorman's YAML configurations, for doorman-node and doorman (not the library).
# prometheus, chromium, tmux: the operations tests check the admin endpoint with promtool and a
# real Prometheus server, render the status page in headless Chromium, and drive `doorman watch`
# in a real terminal.
# libssl-dev, openssl: TLS (doorman::tls), and the tests' certificates (examples/make_certs.sh).
# libgrpc++-dev, protobuf-compiler-grpc: Doorman's gRPC protocol on the node (doorman::grpc);
# golang-go, golang-google-grpc-dev, golang-goprotobuf-dev: a Go client of it, in the tests.
# python3-grpcio, python3-protobuf, protobuf-compiler: a Python client of doorman-rls, in the tests.
# python3-build, python3-wheel, python3-setuptools, mypy, python3-pytest, python3-pytest-asyncio:
# the Python client's wheel, its type check and its tests.
# python3-yaml: the check of the Kubernetes kit (deploy/kubernetes/check_kit.py).
# ninja-build: the demo preset's generator (it compiles the demo's units side by side).
build="cmake g++ make ninja-build ccache libasio-dev nlohmann-json3-dev libfmt-dev"
packages="$build catch2 libbenchmark-dev etcd-server libyaml-cpp-dev prometheus chromium tmux libssl-dev openssl libgrpc++-dev protobuf-compiler-grpc golang-go golang-google-grpc-dev golang-goprotobuf-dev python3-grpcio python3-protobuf protobuf-compiler python3-build python3-wheel python3-setuptools mypy python3-pytest python3-pytest-asyncio python3-yaml"
# kubectl (Debian's kubernetes-client unless one is there): the Kubernetes kit (deploy/) is
# rendered with `kubectl kustomize` and checked against doorman-node.
if ! command -v kubectl >/dev/null 2>&1; then
  packages="$packages kubernetes-client"
fi
if [ "${1:-}" = demo ]; then
  packages="$build"
fi
# `install-deps.sh tools`: what `make tools` builds the programs with: the demo's, and the
# optional layers they serve (gRPC, TLS, YAML).
if [ "${1:-}" = tools ]; then
  packages="$build libgrpc++-dev protobuf-compiler-grpc libssl-dev libyaml-cpp-dev"
fi
# `install-deps.sh package`: what `make package` and its check need: dpkg-shlibdeps (dpkg-dev)
# for the package's dependencies, systemd-analyze (systemd) to verify the unit.
if [ "${1:-}" = package ]; then
  packages="$packages dpkg-dev systemd adduser"
fi
# `install-deps.sh fuzz`: also clang 16 and its libFuzzer/sanitizer runtimes (Debian 12's
# clang 14 cannot compile the engine), for `make fuzz`.
if [ "${1:-}" = fuzz ]; then
  packages="$packages clang-16 libclang-rt-16-dev"
fi
# `install-deps.sh lint`: the style checks' tools, for `make lint`.
if [ "${1:-}" = lint ]; then
  packages="$packages clang-format universal-ctags"
fi

missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

[ -z "$missing" ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing packages:$missing, and apt-get is not available;" \
       "install them with your package manager" >&2
  exit 1
fi

if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
else
  echo "install-deps: missing packages:$missing; run as root or install sudo" >&2
  exit 1
fi

echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing
