"""The embedded broker: kombu's SQLAlchemy transport with acks that mean something.

kombu's own transport marks a delivered message invisible and keeps only an in-memory note
that it is unacknowledged, so a worker killed with SIGKILL mid-task loses the turn for good,
and acknowledged rows pile up forever. This subclass gives it Redis's semantics:

- an acknowledged (or rejected, or requeued) message's row is deleted;
- a message delivered more than ``visibility_timeout`` seconds ago and still not acknowledged
  becomes visible again, so another worker picks it up.

One lock guards the channel's SQLAlchemy session: under the prefork pool, billiard's result
and timeout handler threads acknowledge messages (``basic_ack``) while the main thread is
inside ``_get``, and a session shared by two threads ends "in 'prepared' state".

``relay.celery_app`` registers it as the ``sqla`` transport, so broker URLs keep kombu's form
(``sqla+sqlite:///data/broker.db``).
"""

from __future__ import annotations

import datetime
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kombu.transport import sqlalchemy as kombu_sqla
from kombu.transport.virtual import Message

DEFAULT_VISIBILITY_TIMEOUT = 3600.0
F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    @functools.wraps(method)
    def run(self: Channel, *args: Any, **kwargs: Any) -> Any:
        with self._session_lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class Channel(kombu_sqla.Channel):
    def __init__(self, connection, **kwargs) -> None:
        options = connection.client.transport_options
        self.visibility_timeout = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))
        self._row_by_tag: dict[str, int] = {}
        self._session_lock = threading.RLock()
        super().__init__(connection, **kwargs)

    def _engine_from_config(self):
        # visibility_timeout is ours, not create_engine's.
        client = self.connection.client
        saved = client.transport_options
        client.transport_options = {k: v for k, v in saved.items() if k != "visibility_timeout"}
        try:
            return super()._engine_from_config()
        finally:
            client.transport_options = saved

    @_locked
    def _get(self, queue: str):
        self._restore_expired(queue)
        obj = self._get_or_create(queue)
        if self.session.bind.name == "sqlite":
            self.session.execute(kombu_sqla.text("BEGIN IMMEDIATE TRANSACTION"))
        try:
            msg = (
                self.session.query(self.message_cls)
                .filter(self.message_cls.queue_id == obj.id, self.message_cls.visible != False)  # noqa: E712
                .order_by(self.message_cls.sent_at, self.message_cls.id)
                .first()
            )
            if msg is None:
                raise kombu_sqla.Empty()
            msg.visible = False
            msg.sent_at = datetime.datetime.now()  # now "delivered at", read by _restore_expired
            payload = kombu_sqla.loads(kombu_sqla.bytes_to_str(msg.payload))
            self._row_by_tag[payload["properties"]["delivery_tag"]] = msg.id
            return payload
        finally:
            self.session.commit()

    def _restore_expired(self, queue: str) -> None:
        cutoff = datetime.datetime.now() - datetime.timedelta(seconds=self.visibility_timeout)
        obj = self._get_or_create(queue)
        self.session.query(self.message_cls).filter(
            self.message_cls.queue_id == obj.id,
            self.message_cls.visible == False,  # noqa: E712
            self.message_cls.sent_at < cutoff,
        ).update({"visible": True}, synchronize_session=False)
        self.session.commit()

    @_locked
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        super()._put(queue, payload, **kwargs)

    @_locked
    def _purge(self, queue: str) -> int:
        return super()._purge(queue)

    @_locked
    def _size(self, queue: str) -> int:
        return super()._size(queue)

    @_locked
    def _forget(self, delivery_tag: str) -> None:
        row_id = self._row_by_tag.pop(delivery_tag, None)
        if row_id is not None:
            self.session.query(self.message_cls).filter(self.message_cls.id == row_id).delete()
            self.session.commit()

    @_locked
    def basic_ack(self, delivery_tag, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple=multiple)
        self._forget(delivery_tag)

    @_locked
    def basic_reject(self, delivery_tag, requeue: bool = False) -> None:
        # A requeue goes through _restore, which writes a fresh row.
        super().basic_reject(delivery_tag, requeue=requeue)
        self._forget(delivery_tag)

    @_locked
    def _restore(self, message: Message) -> None:
        super()._restore(message)
        self._forget(message.delivery_tag)


class Transport(kombu_sqla.Transport):
    Channel = Channel
    polling_interval = 0.05  # kombu's 1 s would add a second to every embedded turn
