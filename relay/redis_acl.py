"""The Redis ACL users of one game: the bot's, and the workers' with only what Celery, kombu and the game's own records
need (docs/operating.md, "A worker on a network you don't own").

Written from what a worker sends while it plays, takes a turn handed back after a kill and lives through a Redis
restart (MONITOR on a real Redis 7; tests/test_redis_acl.py plays those turns under these rules):

- the broker (kombu): its queues (``{queue}``, ``{queue}\\x06\\x16{priority}``, ``{queue}.unacked*``), the exchange
  bindings (``_kombu.binding*``, some in Lua scripts), the remote-control mailboxes (``*.celery.pidbox*``, which carry
  a cancel's revoke) and the event channels (``/{db}.celeryev/*``, ``/{db}.celery.pidbox``);
- the result store (Celery): ``celery-task-meta-*`` keys and channels. Celery reads a task's state before it writes
  it (it never overwrites a success), so a worker can read a result whose task id it knows: Redis cannot tell one
  task's key from another's in a pattern. What it cannot do is list them (no KEYS, no SCAN);
- the game's records (``animegamer:*``: claims, cancel marks, presence, blobs).

No administrative or dangerous command (FLUSHDB, FLUSHALL, CONFIG, KEYS, SCAN, DEBUG, SHUTDOWN, MONITOR, ACL), and no
key of another game's queue. The bot's user may do what the bot does (it reads presence with SCAN) but nothing
administrative either.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping

# No CLIENT SETINFO: Redis 7.0 does not know it (redis-py sends it on connect and takes a refusal in its stride).
CONNECTION = "+ping +hello +auth +select +echo +client|setname +client|id +info +time"
WORKER_COMMANDS = (
    "+multi +exec +discard +watch +unwatch "
    "+brpop +lpush +rpush +llen "
    "+hset +hget +hdel "
    "+zadd +zrem +zrange +zrangebyscore +zrevrangebyscore "
    "+set +get +getdel +setex +psetex +del +exists +expire +pexpire +pttl +ttl +mget "
    "+sadd +srem +smembers "
    "+evalsha +eval +script|load +script|exists "
    "+publish +subscribe +psubscribe +unsubscribe +punsubscribe"
)
BOT_COMMANDS = "+@all -@admin -@dangerous +scan +info"  # SCAN: the workers' presence records (animegamer check too)


def keys(queue: str, broker_db: int = 0) -> str:
    """The keys and channels one game's processes touch: its queues (and their per-character queues) and the rest.
    Kombu names its channels after the broker's database number, and a pattern a process subscribes to (PSUBSCRIBE)
    must be allowed as written, not matched by a wider one."""
    events = f"/{broker_db}.celeryev"
    return (
        f"~{queue}* ~_kombu.binding* ~*.celery.pidbox* ~celeryev.* ~celery-task-meta-* ~animegamer:* "
        f"&{events}/* &{events}/worker.* &/{broker_db}.celery.pidbox &celery-task-meta-*"
    )


def worker_rules(queue: str) -> str:
    """What a worker of the game on ``queue`` may do: a user line's rules, after its name and password."""
    return f"resetkeys resetchannels -@all {CONNECTION} {WORKER_COMMANDS} {keys(queue)}"


def bot_rules(queue: str) -> str:
    return f"resetkeys resetchannels -@all {BOT_COMMANDS} {keys(queue)}"


def worker_user(name: str, password: str, queue: str) -> str:
    """A ``user`` line of an ACL file (or a ``redis-server --user`` argument) for a worker of the game on ``queue``."""
    return f"{name} on >{password} {worker_rules(queue)}"


def bot_user(name: str, password: str, queue: str) -> str:
    return f"{name} on >{password} {bot_rules(queue)}"


# The users an ACL file made here holds (compose.tls.yaml, deploy/kubernetes/overlays/trial-tls): the names the URLs of
# the bot and the workers carry, and one the server's own health check signs in as, which may only PING.
BOT = "animegamer-bot"
WORKER = "animegamer-worker"
HEALTH = "animegamer-health"
# Where each password is read from by ``python -m relay.redis_acl``: the environment, never the command line.
PASSWORDS = {BOT: "REDIS_BOT_PASSWORD", WORKER: "REDIS_WORKER_PASSWORD", HEALTH: "REDIS_HEALTH_PASSWORD"}


def stored(password: str) -> str:
    """A password as an ACL file keeps it: ``#`` and its SHA-256, so the file opens nothing when read, and a password
    may hold any character (a space or a quote would end a ``>`` password)."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def acl_file(queue: str, bot_password: str, worker_password: str, health_password: str) -> str:
    """An ACL file (``redis-server --aclfile``) for one game: the default user off, so that no connection does
    anything before it signs in as one of the game's users; the bot's and the workers' users; and a user that may
    only PING, for the server's health check."""
    return "".join(
        f"user {line}\n"
        for line in (
            "default off resetpass resetkeys resetchannels -@all",
            f"{BOT} on {stored(bot_password)} {bot_rules(queue)}",
            f"{WORKER} on {stored(worker_password)} {worker_rules(queue)}",
            f"{HEALTH} on {stored(health_password)} resetkeys resetchannels -@all +ping",
        )
    )


def main(environ: Mapping[str, str]) -> int:
    """``python -m relay.redis_acl > users.acl``: the ACL file of the game on ``ANIMEGAMER_QUEUE`` (default
    ``turns``), each user's password read from the variable ``PASSWORDS`` names. A missing one is named (never a
    value) and nothing is written."""
    missing = [variable for variable in PASSWORDS.values() if not environ.get(variable)]
    if missing:
        print(f"set {', '.join(missing)}: the password of each of the game's Redis users", file=sys.stderr)
        return 2
    queue = environ.get("ANIMEGAMER_QUEUE") or "turns"
    sys.stdout.write(acl_file(queue, *(environ[PASSWORDS[user]] for user in (BOT, WORKER, HEALTH))))
    return 0


if __name__ == "__main__":
    sys.exit(main(os.environ))
