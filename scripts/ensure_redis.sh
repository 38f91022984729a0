#!/usr/bin/env bash
# Make a Redis answer on $ANIMEGAMER_TEST_REDIS_URL for the tests, if this machine allows it.
# Starts redis-server when none answers, installing Debian's package first when missing and root.
# When neither works the Redis tests skip themselves with the reason; this script never fails the run.
set -u
url=${ANIMEGAMER_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
hostport=${url#redis://}; hostport=${hostport%%/*}
host=${hostport%%:*}; port=${hostport##*:}
[ "$port" = "$host" ] && port=6379
py=${PYTHON:-.venv/bin/python}

answers() {
  "$py" - "$url" <<'PY' 2>/dev/null
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping()
PY
}

if answers; then echo "Redis answers at $url"; exit 0; fi
case "$host" in 127.0.0.1|localhost) ;; *) echo "Redis at $url does not answer; its tests will skip."; exit 0;; esac
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing Debian's redis-server for the tests..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null 2>&1
  fi
fi
if command -v redis-server >/dev/null; then
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --daemonize yes >/dev/null
  for _ in $(seq 50); do answers && { echo "Started redis-server on port $port"; exit 0; }; sleep 0.1; done
fi
echo "No Redis at $url and none could be started; the Redis tests will skip."
exit 0
