#!/usr/bin/env sh
# The Python client's tests, as a user gets the package: the wheel built offline
# (python3 -m build --no-isolation, Debian's python3-build), type-checked (mypy --strict), then
# installed into a directory of its own and tested there with pytest against real nodes, with
# the source tree out of the way. Always /usr/bin/python3 (Debian's).
# Usage: python/tests/run.sh DOORMAN_NODE_BINARY [WORK_DIR]
set -eu
node=$1
here=$(cd "$(dirname "$0")/.." && pwd)   # python/
work=${2:-$(mktemp -d)}
py=/usr/bin/python3
rm -rf "$work/src" "$work/dist" "$work/site"
mkdir -p "$work/site"
cp -r "$here" "$work/src"                  # build from a copy: the source tree stays clean
rm -rf "$work/src/tests"
"$py" -m build --no-isolation --wheel --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/doorman_client-*.whl)
echo "built $(basename "$wheel")"
"$py" -m zipfile -e "$wheel" "$work/site"  # installed: the wheel's files, as pip lays them out
"$py" -m mypy --strict --no-error-summary "$work/site/doorman"
echo "mypy --strict: no issues"
# Imported from the wheel, not from the source tree.
PYTHONPATH="$work/site" "$py" -c "import doorman, sys; p = doorman.__file__; print('doorman from', p); sys.exit(0 if p.startswith('$work/site') else 1)"
cd "$work"
DOORMAN_NODE_BINARY=$node PYTHONPATH="$work/site" "$py" -m pytest -q -p no:cacheprovider "$here/tests"
