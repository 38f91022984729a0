#!/bin/sh
# Python 3 with venv where the base image has none (a CUDA image: Ubuntu's Python); the Python images have it.
set -eu
if python3 -c "import venv, ensurepip" 2>/dev/null; then
    exit 0
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates
rm -rf /var/lib/apt/lists/*
