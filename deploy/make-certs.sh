#!/bin/sh
# A private CA and a server certificate for docker-compose.yml's proxy, in deploy/certs/:
#   ca.crt      the CA agents verify the server with (ASTRAEUS_AGENT_CA_FILE / --ca-file)
#   ca.key      the CA's key: keep it offline once the certificates are made
#   server.crt  the proxy's certificate, for every name given (the first is PUBLIC_HOST)
#   server.key  its key
# A CA already there is kept, so a server certificate can be renewed with the same CA.
# With a certificate from a public CA instead, put its chain in server.crt, its key in
# server.key, and the CA that issued it in ca.crt.
#
#   deploy/make-certs.sh astraeus.example.com [other names or addresses...]
set -eu

[ $# -ge 1 ] || { echo "usage: $0 PUBLIC_HOST [NAME_OR_ADDRESS...]" >&2; exit 2; }
dir="$(dirname "$0")/certs"
umask 077
mkdir -p "$dir"
cd "$dir"

if [ ! -f ca.key ]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout ca.key -out ca.crt -days 3650 -subj "/CN=Astraeus CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

names=""
for name in "$@"; do
  case "$name" in
    *[!0-9.]*) case "$name" in *:*) kind=IP ;; *) kind=DNS ;; esac ;;
    *) kind=IP ;;
  esac
  names="${names:+$names,}$kind:$name"
done

openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout server.key -out server.csr -subj "/CN=$1"
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n' \
  "$names" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 397 \
  -extfile server.ext -out server.crt
rm -f server.csr server.ext
chmod 0644 ca.crt server.crt
echo "made $dir/server.crt for $names, signed by $dir/ca.crt"
