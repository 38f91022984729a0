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


def worker_user(name: str, password: str, queue: str) -> str:
    """A ``user`` line of an ACL file (or a ``redis-server --user`` argument) for a worker of the game on ``queue``."""
    return f"{name} on >{password} resetkeys resetchannels -@all {CONNECTION} {WORKER_COMMANDS} {keys(queue)}"


def bot_user(name: str, password: str, queue: str) -> str:
    return f"{name} on >{password} resetkeys resetchannels -@all {BOT_COMMANDS} {keys(queue)}"
