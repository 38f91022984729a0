#!/bin/sh
# A private CA and the certificates it signs, for a trial with TLS (compose.tls.yaml runs this in its one-shot
# service; for Kubernetes an operator runs it once, deploy/kubernetes/overlays/trial-tls). With openssl alone: the bot
# image has it (Debian's ca-certificates needs it), where `cryptography` is only a test dependency.
#
#   sh deploy/tls/make-certificates.sh DIR
#
# makes, each folder holding only what its reader needs, and the CA's certificate beside it:
#   DIR/ca/        ca.pem, ca.key: the CA's key stays here (keep it, or delete it once the certificates are made)
#   DIR/redis/     server.pem, server.key: Redis's certificate, for the names in REDIS_NAMES (default: redis)
#   DIR/postgres/  server.pem, server.key, pg_hba.conf: PostgreSQL's, for POSTGRES_NAMES (default: postgres)
#   DIR/bot/       client.pem, client.key: the bot's client certificate (Redis asks every client for one)
#   DIR/worker/    client.pem, client.key: the workers'
# Every server certificate names localhost and 127.0.0.1 too (the servers' own health checks). Keys are P-256 (the
# tests' own certificates are too), readable by their owner only. A file already there is kept: running it again
# changes nothing, so to renew one (or to name another host), delete it and run this again.
set -eu

dir=${1:?usage: make-certificates.sh DIR}
redis_names=${REDIS_NAMES:-redis}
postgres_names=${POSTGRES_NAMES:-postgres}
days=${DAYS:-825}  # the leaf certificates'; the CA's is ten years
umask 077
mkdir -p "$dir/ca" "$dir/redis" "$dir/postgres" "$dir/bot" "$dir/worker"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The smallest configuration openssl req needs, so that nothing depends on the system's openssl.cnf.
cat > "$work/req.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical, CA:true, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF

key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

if [ ! -s "$dir/ca/ca.pem" ]; then
    key "$dir/ca/ca.key"
    openssl req -new -x509 -config "$work/req.cnf" -extensions ca -key "$dir/ca/ca.key" -subj "/CN=AnimeGamer CA" \
        -days 3650 -sha256 -out "$dir/ca/ca.pem"
fi

# signed FOLDER NAME USAGE COMMON-NAME [HOST...]: NAME.pem and NAME.key in FOLDER, signed by the CA; a server's
# certificate names its hosts, localhost and 127.0.0.1.
signed() {
    folder=$1 name=$2 usage=$3 common=$4
    shift 4
    if [ -s "$folder/$name.pem" ]; then
        return 0
    fi
    cat > "$work/leaf.cnf" <<EOF
[leaf]
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = $usage
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    if [ $# -gt 0 ]; then
        names=""
        for host in "$@" localhost 127.0.0.1; do
            case $host in
                *[!0-9.]*) names="$names${names:+,}DNS:$host" ;;
                *) names="$names${names:+,}IP:$host" ;;
            esac
        done
        echo "subjectAltName = $names" >> "$work/leaf.cnf"
    fi
    key "$folder/$name.key"
    openssl req -new -config "$work/req.cnf" -key "$folder/$name.key" -subj "/CN=$common" -out "$work/leaf.csr"
    openssl x509 -req -in "$work/leaf.csr" -CA "$dir/ca/ca.pem" -CAkey "$dir/ca/ca.key" \
        -CAserial "$dir/ca/ca.srl" -CAcreateserial -days "$days" -sha256 \
        -extfile "$work/leaf.cnf" -extensions leaf -out "$folder/$name.pem" 2>/dev/null
}

# Redis's own certificate serves as a client's too (its health check's redis-cli, a replica's link), so it may be
# used for both.
# shellcheck disable=SC2086  # the names are words on purpose
signed "$dir/redis" server "serverAuth, clientAuth" redis $redis_names
# shellcheck disable=SC2086
signed "$dir/postgres" server serverAuth postgres $postgres_names
signed "$dir/bot" client clientAuth animegamer-bot
signed "$dir/worker" client clientAuth animegamer-worker

for folder in redis postgres bot worker; do
    cp "$dir/ca/ca.pem" "$dir/$folder/ca.pem"
    chmod 644 "$dir/$folder/ca.pem"
done
chmod 644 "$dir/ca/ca.pem"

# PostgreSQL over TLS only: the socket inside its container as the image has it (its entrypoint and pg_isready),
# and every connection over the network encrypted (hostssl) and signed in with a password.
cat > "$dir/postgres/pg_hba.conf" <<'EOF'
local   all all     trust
hostssl all all all scram-sha-256
EOF
echo "certificates in $dir: the CA's is $dir/ca/ca.pem"
