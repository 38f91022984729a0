"""Which waiting turn goes to the workers next: every server gets its share, whatever the others queue.

The workers are shared by every server the bot is in. First come, first served would let one busy
server (two hundred players acting at once) make a quiet server's single turn wait behind its whole
backlog. So the bot keeps its backlog in the database and hands the broker only a short window of
turns at a time (``window_for``), chosen by this rule:

    least attained service first, per server: the next turn is the oldest waiting turn of the
    server with the fewest turns being made (sent to the broker or running) right now; ties go to
    the server whose oldest waiting turn is older.

That is round robin over the servers that have turns waiting, weighted against those already
holding workers. A player has at most one turn in flight (``db.jobs``), so within a server every
waiting player is already served in arrival order. A turn's wait then depends on how many servers
are waiting and on its own server's backlog, not on another server's.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

MIN_WINDOW = 4  # turns at the broker per queue even with no worker known yet
WINDOW_PER_WORKER = 2  # one running and one waiting each, so no worker idles between the bot's ticks


@dataclass(frozen=True)
class Waiting(Generic[T]):
    """A turn that waits for the workers: its place in arrival order, its server, and what to send."""

    order: int  # arrival order (the job id)
    server: Hashable  # the guild; None for turns outside any server
    item: T


def fair_order(waiting: Iterable[Waiting[T]], in_service: Mapping[Hashable, int] | None = None) -> list[Waiting[T]]:
    """Every waiting turn, in the order the rule above sends them."""
    by_server: dict[Hashable, list[Waiting[T]]] = defaultdict(list)
    for turn in sorted(waiting, key=lambda w: w.order):
        by_server[turn.server].append(turn)
    served = dict(in_service or {})
    # One heap entry per server with turns left: (turns in service, its oldest waiting turn's order, server).
    heap = [(served.get(server, 0), turns[0].order, i, server) for i, (server, turns) in enumerate(by_server.items())]
    heapq.heapify(heap)
    taken = dict.fromkeys(by_server, 0)
    ordered: list[Waiting[T]] = []
    while heap:
        load, _, i, server = heapq.heappop(heap)
        turns = by_server[server]
        ordered.append(turns[taken[server]])
        taken[server] += 1
        if taken[server] < len(turns):
            heapq.heappush(heap, (load + 1, turns[taken[server]].order, i, server))
    return ordered


def fifo_order(waiting: Iterable[Waiting[T]]) -> list[Waiting[T]]:
    """First come, first served: what ``fair_order`` is measured against (ANIMEGAMER_FAIR_QUEUE=false)."""
    return sorted(waiting, key=lambda w: w.order)


def window_for(workers: int) -> int:
    """How many turns one queue may hold at the broker, not yet started, with ``workers`` consuming it."""
    return max(MIN_WINDOW, WINDOW_PER_WORKER * workers)


def turns_ahead(at_broker: int, mine_before: int, others_waiting: int) -> int:
    """A new turn's place under the rule, at most: the broker's window, then one round for each turn of its
    own server waiting before it, each round taking one turn of every other waiting server."""
    return at_broker + mine_before * (1 + others_waiting) + others_waiting
