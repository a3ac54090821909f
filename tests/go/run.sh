#!/bin/sh
# A Go client, generated from proto/doorman.proto with Debian's protoc-gen-go and built against
# Debian's grpc-go (GOPATH mode, offline), against a real doorman-node: Doorman's Go ecosystem
# speaks to the node unchanged.
# Usage: run.sh NODE_BINARY SOURCE_DIR WORK_DIR
set -eu
node=$1
src=$2
work=$3
rm -rf "$work"
mkdir -p "$work/src/doorman.test/pb" "$work/src/doorman.test/client"
protoc -I "$src/proto" --go_out=plugins=grpc,paths=source_relative:"$work/src/doorman.test/pb" \
  "$src/proto/doorman.proto"
cp "$src/tests/go/main.go" "$work/src/doorman.test/client/"
(cd "$work/src/doorman.test/client" &&
  GOPATH="$work:/usr/share/gocode" GO111MODULE=off GOCACHE="$work/cache" GOFLAGS= \
    go build -o "$work/client" .)
cat > "$work/config.json" <<'JSON'
{"resources": [{"identifier_glob": "*", "capacity": 100, "algorithm": {"kind": "FAIR_SHARE",
  "lease_length": 20, "refresh_interval": 4, "learning_mode_duration": 0}}]}
JSON
: > "$work/node.log"  # there before the node opens it: the loop below reads it at once (set -e)
"$node" --listen 127.0.0.1:0 --admin off --grpc-listen 127.0.0.1:0 --config "$work/config.json" \
  2> "$work/node.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
address=""
for _ in $(seq 1 100); do
  address=$(sed -n 's/.*doorman.Capacity (gRPC) listening on //p' "$work/node.log")
  [ -n "$address" ] && break
  sleep 0.1
done
[ -n "$address" ] || { cat "$work/node.log"; exit 1; }
out=$(timeout 20 "$work/client" "$address")
echo "$out"
echo "$out" | grep -qx "is_master true"
echo "$out" | grep -q "^resource api capacity 25 expires_in 1[89] refresh 4$\|^resource api capacity 25 expires_in 20 refresh 4$"
echo "$out" | grep -qx "mastership present false"
echo "$out" | grep -q "^bad request: rpc error: code = InvalidArgument desc = resource\[0\].wants: "
