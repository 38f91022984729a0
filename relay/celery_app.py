"""The Celery app, configured from settings; importing this module builds none and never imports torch.

Each process makes its own with ``make_celery(settings)``: the bot and the CLI to send
``animegamer.generate_turn`` by name, a worker to run it (``worker.tasks`` defines it as a shared task,
which joins the app it runs in). Long GPU turns
want late acks (a worker that vanishes leaves its message to be delivered again; the job's
claim keeps a second delivery from running it twice), one message prefetched at a time, and a
hard time limit, which the prefork pool enforces by killing the child (stored as a failure).
A pool child that dies mid-turn (a segfault, the OOM killer) is stored as a failure too: a turn
that kills its child would kill the next one, so it is not redelivered.

Results are not extended: Celery would copy the task's arguments (a turn's whole history) into
every stored state, each progress report included, and nobody reads them back.
"""

from __future__ import annotations

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES
from kombu.utils.url import maybe_sanitize_url

from game.contract import RESULT_KEEP_SECONDS, TASK_NAME
from game.instruction import parse, unreadable
from relay.settings import Settings
from relay.tls import certificate_problem

RELEASE_MODEL = "animegamer"  # worker.pipeline.config.RELEASE, without importing the model code

# Our SQLAlchemy transport deletes acked messages and redelivers lost ones (see sqlite_broker.py).
TRANSPORT_ALIASES["sqla"] = "relay.sqlite_broker:Transport"


def make_celery(settings: Settings) -> Celery:
    app = Celery("animegamer", broker=settings.broker_url, backend=settings.result_backend)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
        task_time_limit=settings.task_time_limit,
        worker_lost_wait=2.0,  # report a dead pool child's turn in 2 s, not 10
        # 30 s to fail a stuck turn with a message before the kill; half a short limit (a test's 20 s)
        task_soft_time_limit=settings.task_time_limit - min(30, settings.task_time_limit // 2),
        task_default_queue=settings.queue,
        task_routes={TASK_NAME: {"queue": settings.queue}},
        result_expires=RESULT_KEEP_SECONDS,
        # Events for Flower and `celery events` (Redis, RabbitMQ); Celery sends none over the SQL transport.
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.broker_timeout,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            # Kombu puts back every delivered message older than the consumer's visibility timeout from one index
            # per Redis database: one per game's queues, so a game (or test) with a short timeout on the same
            # database never hands another game's running turn to a second worker.
            "unacked_key": f"{settings.queue}.unacked",
            "unacked_index_key": f"{settings.queue}.unacked_index",
            "unacked_mutex_key": f"{settings.queue}.unacked_mutex",
            "socket_connect_timeout": settings.broker_timeout,
            "socket_timeout": max(settings.broker_timeout, 10.0),
        },
        # A result store that went away must fail a read in seconds (Celery's default retries ~20 s).
        result_backend_transport_options={
            "retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
        },
        redis_socket_connect_timeout=settings.broker_timeout,
        redis_socket_timeout=max(settings.broker_timeout, 10.0),
    )
    if settings.broker_url.startswith("sqla+"):
        # Only Redis understands the socket options; create_engine would refuse them.
        app.conf.broker_transport_options = {"visibility_timeout": settings.visibility_timeout}
    return app


def queue_for(settings: Settings, character: str) -> str:
    """Published checkpoints are one MLLM + decoder pair per character, so each has its own queue,
    consumed by the workers that loaded that pair; random-weight models serve any character."""
    if settings.model == RELEASE_MODEL:
        return f"{settings.queue}.{character.casefold()}"
    return settings.queue


def queue_of_stored(settings: Settings, instruction: str) -> str:
    """The queue a stored turn goes to. Never raises, whatever the row holds: an instruction this version cannot
    read (stored before a grammar change, or one a parser bug trips on) goes with the default queue, and the
    supervisor fails that turn alone (``game.instruction.unreadable``)."""
    if settings.model != RELEASE_MODEL or unreadable(instruction) is not None:
        return settings.queue
    return queue_for(settings, parse(instruction).character)


def served_queues(settings: Settings) -> list[str]:
    if settings.model == RELEASE_MODEL:
        return [queue_for(settings, character) for character in settings.characters]
    return [settings.queue]


class BrokerUnavailable(RuntimeError):
    """The queue does not answer; the message says which one and what to do."""


def check_broker(app: Celery, timeout: float) -> None:
    """Fail in seconds, not minutes, when the broker or a Redis result store is down."""
    broker = maybe_sanitize_url(app.conf.broker_url)
    try:
        with app.connection_for_write(connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout)
        if app.conf.result_backend.startswith(("redis://", "rediss://")):
            app.backend.client.ping()
    except Exception as exc:
        if refused_credentials(exc):  # it answers: sending the operator to start it would be the wrong errand
            raise BrokerUnavailable(
                f"The queue at {broker} refuses this user name or password ({exc}): set the password as typed in "
                "ANIMEGAMER_REDIS_PASSWORD (docs/operating.md), or check the user's ACL."
            ) from exc
        if (problem := certificate_problem(exc)) is not None:  # it answers; what it showed was not trusted
            raise BrokerUnavailable(f"The queue at {broker} was refused: {problem.said}: {problem.fix}.") from exc
        raise BrokerUnavailable(
            f"The queue at {broker} does not answer ({type(exc).__name__}: {exc}). "
            "Start it, or unset ANIMEGAMER_BROKER_URL and ANIMEGAMER_RESULT_BACKEND to use the embedded queue."
        ) from exc


def refused_credentials(exc: BaseException) -> bool:
    """Whether Redis answered and refused the credentials (kombu wraps redis-py's error in its own)."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if type(seen).__name__ == "AuthenticationError" or "WRONGPASS" in text or "username-password" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
