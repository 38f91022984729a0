"""The fair rule that picks which waiting turn goes to the workers next."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from game.schedule import MIN_WINDOW, Waiting, fair_order, fifo_order, turns_ahead, window_for


def turns(*servers: str) -> list[Waiting[int]]:
    """One waiting turn per name, in arrival order (the item is its order)."""
    return [Waiting(order, server, order) for order, server in enumerate(servers)]


def test_a_quiet_server_goes_right_after_the_first_turn_of_a_flooding_one() -> None:
    waiting = turns(*["flood"] * 50, "quiet")
    ordered = [w.server for w in fair_order(waiting)]
    assert ordered.index("quiet") == 1
    assert [w.server for w in fifo_order(waiting)].index("quiet") == 50


def test_a_server_already_holding_workers_waits_for_the_others() -> None:
    ordered = fair_order(turns("busy", "busy", "idle", "idle"), in_service={"busy": 3})
    assert [w.server for w in ordered] == ["idle", "idle", "busy", "busy"]


def test_a_servers_own_turns_keep_their_arrival_order() -> None:
    ordered = fair_order(turns("a", "b", "a", "a", "b"))
    assert [w.order for w in ordered if w.server == "a"] == [0, 2, 3]
    assert [w.order for w in ordered if w.server == "b"] == [1, 4]


@given(st.lists(st.integers(min_value=0, max_value=6), max_size=80))
def test_every_turn_goes_once_and_waits_at_most_one_round_per_turn_of_its_own_server_ahead(servers: list[int]) -> None:
    waiting = turns(*map(str, servers))
    ordered = fair_order(waiting)
    assert sorted(w.order for w in ordered) == list(range(len(waiting)))
    rounds = len(set(servers)) or 1
    for place, turn in enumerate(ordered):
        own_ahead = sum(1 for w in waiting if w.server == turn.server and w.order < turn.order)
        assert place < (own_ahead + 1) * rounds, (place, turn, own_ahead, rounds)


def test_the_estimate_never_puts_a_turn_before_where_the_rule_sends_it() -> None:
    waiting = turns(*["flood"] * 30, "q1", "q2", "q3", "mine", "mine")
    ordered = fair_order(waiting)
    last = max(place for place, w in enumerate(ordered) if w.server == "mine")
    others = len({"flood", "q1", "q2", "q3"})
    assert turns_ahead(at_broker=0, mine_before=1, others_waiting=others) >= last


def test_each_queue_holds_a_window_that_grows_with_its_workers() -> None:
    assert window_for(0) == MIN_WINDOW
    assert window_for(10) > window_for(2) >= MIN_WINDOW
