#!/usr/bin/env bash
# deploy/k8s/make-secret.sh: the token and TLS material of an l2l deployment on Kubernetes
# (deploy/k8s/README.md), made with openssl into a new directory (mode 0700, files 0600):
#
#   token      a shared token (openssl rand -hex 32)
#   tls.crt    a self-signed certificate whose names are every shard's stable DNS name
#   tls.key    (l2l-eps-K.l2l-eps, .NAMESPACE.svc, .NAMESPACE.svc.cluster.local, K < SHARDS)
#              plus localhost / 127.0.0.1 (l2lctl inside a shard's pod)
#
# Usage: make-secret.sh OUT_DIR [NAMESPACE [SHARDS]]     (defaults: default, 1)
# then:  kubectl -n NAMESPACE create secret generic l2l-secrets --from-file=OUT_DIR/token \
#          --from-file=OUT_DIR/tls.crt --from-file=OUT_DIR/tls.key
# and remove OUT_DIR (or keep it somewhere safe). Nothing is printed but the file names.
set -euo pipefail
die() { echo "make-secret.sh: error: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 3 ] || die "usage: $0 OUT_DIR [NAMESPACE [SHARDS]]"
out=$1 ns=${2:-default} shards=${3:-1}
[[ $ns =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "NAMESPACE '$ns' is not a Kubernetes namespace name"
[[ $shards =~ ^[0-9]+$ ]] && [ "$shards" -ge 1 ] && [ "$shards" -le 1024 ] || die "SHARDS must be 1..1024, got '$shards'"
[ ! -e "$out" ] || die "$out exists; give a new directory"
command -v openssl >/dev/null || die "openssl is not installed"
umask 077
mkdir -p "$out"
san="DNS:localhost,IP:127.0.0.1"
for ((k = 0; k < shards; ++k)); do
  n=l2l-eps-$k.l2l-eps
  san="$san,DNS:$n,DNS:$n.$ns.svc,DNS:$n.$ns.svc.cluster.local"
done
openssl rand -hex 32 >"$out/token"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 -subj "/CN=l2l-eps" \
  -addext "subjectAltName=$san" -keyout "$out/tls.key" -out "$out/tls.crt" 2>"$out/.openssl.log" ||
  { cat "$out/.openssl.log" >&2; die "openssl could not make the certificate"; }
rm -f "$out/.openssl.log"
chmod 0600 "$out/token" "$out/tls.key" "$out/tls.crt"
echo "make-secret.sh: wrote $out/token, $out/tls.crt, $out/tls.key (names for $shards shard(s) in namespace $ns)"
