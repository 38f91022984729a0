"""A result belongs to its turn: proved with the ticket the bot gave that turn alone.

Anyone holding a worker's Redis credentials can write a result under any task id (Celery's result keys are plain
keys), and the bot would post it to that turn's server with the writer's word that the detector passed it. So the bot
gives each turn a ticket, an HMAC of the turn's task id under the game's secret (kept in its database, never on a
worker), sent inside the turn's message; the worker returns an HMAC of the result under that ticket; the bot, which
can make the ticket again, takes no result without it. A writer that was not given the turn's message cannot make
the proof: every field the bot acts on is in it (the clip and representation by digest, the state changes and the
safety report), the timings aside.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from game.contract import TurnResult

UNPROVED = frozenset({"proof", "timings"})  # not proved: the proof itself, and how long each stage took


def ticket_for(secret: bytes, task_id: str) -> str:
    return hmac.new(secret, f"ticket:{task_id}".encode(), hashlib.sha256).hexdigest()


def proof_of(ticket: str, result: TurnResult) -> str:
    fields = result.model_dump(mode="json", exclude=set(UNPROVED))
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hmac.new(ticket.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def proved(result: TurnResult, secret: bytes, task_id: str) -> bool:
    return hmac.compare_digest(result.proof, proof_of(ticket_for(secret, task_id), result))
