#!/bin/sh
# Makes the certificates the TLS tests use, with the openssl CLI, into DIR (created):
#   ca.pem/ca.key            the tree's CA
#   other-ca.pem             an unrelated CA
#   node.pem/.key            a node: DNS:localhost, IP:127.0.0.1, URI spiffe://doorman.test/node/root
#   leaf.pem/.key            an intermediate: same names, URI spiffe://doorman.test/node/leaf
#   client-a.pem/.key        URI spiffe://doorman.test/client/a
#   client-b.pem/.key        URI spiffe://doorman.test/client/b
#   admin.pem/.key           DNS admin.doorman.test (no URI: the DNS name is the identity)
#   cn-only.pem/.key         no SAN; CN cn-only (the CN is the identity)
#   rogue.pem/.key           URI spiffe://doorman.test/client/a, signed by the other CA
#   expired.pem/.key         URI spiffe://doorman.test/client/a, valid only in 2020
#   wrong-name.pem/.key      a node certificate for DNS:wrong.example only
#   node2.pem/.key           node's names, URI spiffe://doorman.test/node/root-2 (rotation)
# Usage: make_certs.sh DIR
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() {  # name subject
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

# leaf NAME SUBJECT-CN SAN [CA]
leaf() {
  name=$1 cn=$2 san=$3 issuer=${4:-ca}
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=digitalSignature"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    if [ -n "$san" ]; then echo "subjectAltName=$san"; fi
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA "$issuer.pem" -CAkey "$issuer.key" -CAcreateserial \
    -days 365 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

ca ca "doorman test CA"
ca other-ca "another CA"
node_names="DNS:localhost,IP:127.0.0.1"
leaf node node "$node_names,URI:spiffe://doorman.test/node/root"
leaf node2 node "$node_names,URI:spiffe://doorman.test/node/root-2"
leaf leaf leaf "$node_names,URI:spiffe://doorman.test/node/leaf"
leaf client-a client-a "URI:spiffe://doorman.test/client/a"
leaf client-b client-b "URI:spiffe://doorman.test/client/b"
leaf admin admin "DNS:admin.doorman.test"
leaf cn-only cn-only ""
leaf rogue client-a "URI:spiffe://doorman.test/client/a" other-ca
leaf wrong-name wrong "DNS:wrong.example"

# An expired certificate: `openssl ca` can set the validity dates.
mkdir -p expired-ca
: > expired-ca/index.txt
cat > expired-ca/ca.conf <<CONF
[ca]
default_ca = test
[test]
database = expired-ca/index.txt
new_certs_dir = expired-ca
serial = expired-ca/serial
default_md = sha256
policy = anything
copy_extensions = copy
[anything]
commonName = supplied
CONF
echo 01 > expired-ca/serial
key expired.key
openssl req -new -key expired.key -subj "/CN=client-a" \
  -addext "subjectAltName=URI:spiffe://doorman.test/client/a" -out expired.csr
openssl ca -batch -config expired-ca/ca.conf -cert ca.pem -keyfile ca.key -in expired.csr \
  -startdate 20200101000000Z -enddate 20200102000000Z -out expired.pem 2>/dev/null
rm -rf expired.csr expired-ca
