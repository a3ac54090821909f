#!/bin/sh
# Installs the packages `make package` built, checks them as an operator would, and removes
# them (`make package-check`, run by CI as root; docs/deployment.md):
#   dpkg -i; every tool runs from /usr/bin and says the project's version; the system user
#   exists; systemd-analyze accepts the unit (where systemd-analyze is); the node runs as the
#   unit runs it (its user, its environment file, its configuration) and answers `doorman
#   status`; a program builds against the installed headers with find_package(doorman);
#   dpkg -r removes the files and keeps /etc/doorman; dpkg -P removes /etc/doorman and the user.
set -eu
cd "$(dirname "$0")/../.."
packages=build/release/packages
version=$(sed -n 's/^#define DOORMAN_VERSION_STRING "\(.*\)"$/\1/p' include/doorman/version.hpp)
deb=$packages/doorman_${version}_amd64.deb
dev=$packages/doorman-dev_${version}_all.deb
fail() { echo "package check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i)"
[ -f "$deb" ] && [ -f "$dev" ] || fail "no $deb and $dev: run make package first"
if dpkg-query -W doorman >/dev/null 2>&1; then fail "doorman is already installed here"; fi

work=$(mktemp -d)
node_pid=""
cleanup() {
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null || true
  dpkg -P doorman doorman-dev >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== dpkg -i $deb $dev"
dpkg -i "$deb" "$dev"

for tool in doorman-node doorman doorman-sim doorman-rls; do
  [ -x /usr/bin/$tool ] || { [ $tool = doorman-rls ] && continue; fail "/usr/bin/$tool missing"; }
  out=$(/usr/bin/$tool --version)
  [ "$out" = "$tool $version" ] || fail "/usr/bin/$tool --version said \"$out\""
  echo "$out"
done
getent passwd doorman >/dev/null || fail "no user doorman"
[ "$(stat -c %U /usr/bin/doorman-node)" = root ] || fail "/usr/bin/doorman-node not owned by root"

unit=/usr/lib/systemd/system/doorman-node.service
[ -f $unit ] || unit=/lib/systemd/system/doorman-node.service
if command -v systemd-analyze >/dev/null 2>&1; then
  echo "== systemd-analyze verify $unit"
  systemd-analyze verify $unit || fail "systemd-analyze rejects $unit"
else
  echo "== no systemd-analyze here: the unit is not verified"
fi

echo "== the node as the unit runs it: user doorman, /etc/doorman/doorman-node.env"
/usr/bin/doorman config check /etc/doorman/resources.yaml
log=$work/node.log
touch "$log" && chown doorman "$log"
(
  set -a
  . /etc/doorman/doorman-node.env
  set +a
  # Free ports instead of 7700/7780, which another program of this machine may hold.
  DOORMAN_LISTEN=127.0.0.1:0 DOORMAN_ADMIN=127.0.0.1:0 \
    exec setpriv --reuid=doorman --regid=doorman --init-groups /usr/bin/doorman-node
) 2>"$log" &
node_pid=$!
address=""
for _ in $(seq 100); do
  address=$(sed -n 's/.*listening on \([0-9.:]*\)$/\1/p' "$log")
  [ -n "$address" ] && break
  sleep 0.1  # polling the log for the line
done
[ -n "$address" ] || fail "the node did not start: $(cat "$log")"
/usr/bin/doorman --server "$address" status || fail "doorman status against the node failed"
[ "$(stat -c %U /proc/$node_pid)" = doorman ] || fail "the node does not run as doorman"
kill -TERM $node_pid
wait $node_pid || fail "the node did not stop cleanly on SIGTERM: $(cat "$log")"
node_pid=""

echo "== find_package(doorman) against the installed headers"
cmake -S tests/consumer -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null || fail "a consumer does not build against /usr"
"$work/consumer/consumer" >/dev/null || fail "the consumer does not run"

echo "== dpkg -r: the files go, the configuration stays"
dpkg -r doorman doorman-dev
[ ! -e /usr/bin/doorman-node ] || fail "/usr/bin/doorman-node left behind"
[ ! -e $unit ] || fail "$unit left behind"
[ ! -e /usr/include/doorman ] || fail "/usr/include/doorman left behind"
[ -f /etc/doorman/resources.yaml ] || fail "dpkg -r removed the configuration"
echo "== dpkg -P: the configuration and the user go"
dpkg -P doorman
[ ! -e /etc/doorman ] || fail "/etc/doorman left behind after purge"
if getent passwd doorman >/dev/null; then fail "user doorman left behind after purge"; fi
echo "package check: ok"
