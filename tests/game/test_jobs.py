"""The job lifecycle's rules: every move, every deadline, and a stateful model that no run can get stuck in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from game.jobs import (
    FINAL,
    IN_FLIGHT,
    MOVES,
    Event,
    IllegalMove,
    JobClock,
    JobStatus,
    Limits,
    Seen,
    deadline_after,
    move,
    next_event,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LIMITS = Limits(claim=timedelta(seconds=30), run=timedelta(seconds=120), pickup=timedelta(seconds=60), attempts=2)
Q, R = JobStatus.QUEUED, JobStatus.RUNNING


def clock(
    status: JobStatus = Q, *, sent: bool = True, attempts: int = 1, deadline_in: float | None = 30, started_ago=0
):
    deadline = None if deadline_in is None else NOW + timedelta(seconds=deadline_in)
    started = NOW - timedelta(seconds=started_ago) if status is R else None
    return JobClock(status, sent, attempts, deadline, started)


# -- the moves ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", list(JobStatus))
@pytest.mark.parametrize("event", list(Event))
def test_every_event_is_allowed_exactly_from_its_sources(status: JobStatus, event: Event) -> None:
    if status in MOVES[event].sources:
        assert move(status, event) is MOVES[event].target
    else:
        with pytest.raises(IllegalMove):
            move(status, event)


@pytest.mark.parametrize("status", sorted(FINAL))
def test_nothing_leaves_a_final_state(status: JobStatus) -> None:
    assert not [event for event, rule in MOVES.items() if status in rule.sources]


def test_every_state_in_flight_can_reach_an_end() -> None:
    for status in IN_FLIGHT:
        assert {move(status, e) for e, rule in MOVES.items() if status in rule.sources} & FINAL


def test_the_six_states_are_the_issues_six() -> None:
    assert {s.value for s in JobStatus} == {"queued", "running", "done", "failed", "cancelled", "expired"}


# -- the deadlines ---------------------------------------------------------------------------------------


def test_a_stored_result_wins_over_every_deadline() -> None:
    late = clock(R, deadline_in=-999, started_ago=999)
    assert next_event(late, Seen.SUCCEEDED, NOW, LIMITS) is Event.SUCCEEDED
    assert next_event(clock(Q, deadline_in=-1), Seen.FAILED, NOW, LIMITS) is Event.FAILED


def test_a_sent_turn_a_worker_claims_starts() -> None:
    assert next_event(clock(Q), Seen.WORKING, NOW, LIMITS) is Event.STARTED


def test_an_unsent_turn_is_not_started_by_a_claim_left_from_an_earlier_send() -> None:
    assert next_event(clock(Q, sent=False), Seen.WORKING, NOW, LIMITS) is None


def test_a_queued_turn_past_its_deadline_expires_sent_or_not() -> None:
    assert next_event(clock(Q, deadline_in=-1), Seen.NOTHING, NOW, LIMITS) is Event.EXPIRED
    assert next_event(clock(Q, sent=False, deadline_in=0), Seen.NOTHING, NOW, LIMITS) is Event.EXPIRED
    assert next_event(clock(Q, deadline_in=-1), Seen.UNKNOWN, NOW, LIMITS) is Event.EXPIRED


def test_a_story_turn_waiting_for_the_one_before_it_has_no_deadline_of_its_own() -> None:
    assert next_event(clock(Q, sent=False, deadline_in=None), Seen.NOTHING, NOW + timedelta(days=9), LIMITS) is None


def test_a_running_turn_whose_worker_keeps_its_claim_beats() -> None:
    assert next_event(clock(R, deadline_in=5), Seen.WORKING, NOW, LIMITS) is Event.BEAT


def test_a_running_turn_whose_claim_lapsed_is_handed_back_then_failed() -> None:
    lapsed = clock(R, deadline_in=-1, attempts=1)
    assert next_event(lapsed, Seen.NOTHING, NOW, LIMITS) is Event.HANDED_BACK
    again = clock(R, deadline_in=-1, attempts=LIMITS.attempts)
    assert next_event(again, Seen.NOTHING, NOW, LIMITS) is Event.FAILED


def test_a_running_turn_seen_without_a_claim_waits_out_its_lease() -> None:
    assert next_event(clock(R, deadline_in=10), Seen.NOTHING, NOW, LIMITS) is None


def test_an_ended_claim_with_no_result_means_the_result_was_lost() -> None:
    assert next_event(clock(R, deadline_in=10), Seen.ENDED, NOW, LIMITS) is Event.HANDED_BACK


def test_a_sent_turn_the_restarted_broker_lost_is_sent_again() -> None:
    assert next_event(clock(Q), Seen.LOST, NOW, LIMITS) is Event.REQUEUED
    assert next_event(clock(Q, deadline_in=-1), Seen.LOST, NOW, LIMITS) is Event.EXPIRED  # unless it is too late


def test_a_running_turn_a_restarted_broker_forgot_is_handed_back_once_its_lease_lapses() -> None:
    # Its worker may still be computing (it claims the turn again at its next renewal), or the result it stored
    # unread went with the broker: only the lease tells which.
    assert next_event(clock(R, deadline_in=5), Seen.LOST, NOW, LIMITS) is None
    assert next_event(clock(R, deadline_in=-1), Seen.LOST, NOW, LIMITS) is Event.HANDED_BACK


def test_an_unanswered_look_decides_nothing_but_the_time_limit() -> None:
    assert next_event(clock(R, deadline_in=-100), Seen.UNKNOWN, NOW, LIMITS) is None
    over = clock(R, deadline_in=-100, started_ago=LIMITS.run.total_seconds())
    assert next_event(over, Seen.UNKNOWN, NOW, LIMITS) is Event.FAILED


def test_a_turn_over_its_time_limit_fails_even_while_its_worker_beats() -> None:
    over = clock(R, deadline_in=20, started_ago=LIMITS.run.total_seconds() + 1)
    assert next_event(over, Seen.WORKING, NOW, LIMITS) is Event.FAILED


@pytest.mark.parametrize("status", sorted(FINAL))
@pytest.mark.parametrize("seen", list(Seen))
def test_final_jobs_never_move(status: JobStatus, seen: Seen) -> None:
    assert next_event(JobClock(status, True, 1, None, NOW), seen, NOW, LIMITS) is None


def test_the_automatic_pickup_timeout_is_a_few_etas_and_never_under_the_minimum() -> None:
    auto = Limits(claim=timedelta(seconds=30), run=timedelta(seconds=60))
    assert auto.pickup_for(timedelta(seconds=10)) == auto.min_pickup
    assert auto.pickup_for(timedelta(minutes=10)) == timedelta(minutes=30)
    assert LIMITS.pickup_for(timedelta(hours=5)) == LIMITS.pickup  # a setting is the setting


def test_each_state_gets_its_owners_deadline() -> None:
    assert deadline_after(Event.STARTED, NOW, LIMITS) == NOW + LIMITS.claim
    assert deadline_after(Event.BEAT, NOW, LIMITS) == NOW + LIMITS.claim
    assert deadline_after(Event.HANDED_BACK, NOW, LIMITS) == NOW + LIMITS.pickup
    for event in (Event.SUCCEEDED, Event.FAILED, Event.CANCELLED, Event.EXPIRED):
        assert deadline_after(event, NOW, LIMITS) is None


@given(
    status=st.sampled_from(list(JobStatus)),
    sent=st.booleans(),
    attempts=st.integers(0, 5),
    deadline=st.none() | st.integers(-500, 500),
    started_ago=st.integers(0, 500),
    seen=st.sampled_from(list(Seen)),
)
def test_the_supervisor_only_ever_proposes_a_legal_move(status, sent, attempts, deadline, started_ago, seen) -> None:
    job = clock(status, sent=sent, attempts=attempts, deadline_in=deadline, started_ago=started_ago)
    event = next_event(job, seen, NOW, LIMITS)
    if event is not None:
        move(status, event)  # raises if illegal


# -- a stateful model: workers that die, stores that forget, players that cancel -----------------------


class JobLife(RuleBasedStateMachine):
    """One job, driven by the supervisor's rules against a world that misbehaves in every allowed way.

    The world: the broker may lose the message, a worker may take it, die, or finish; the result
    store may go away. Whatever happens, once the world stops misbehaving the job reaches a final
    state within a bounded number of ticks, and it never runs again after a cancel.
    """

    @initialize()
    def submit(self) -> None:
        self.now = NOW
        self.job = JobClock(Q, False, 0, NOW + LIMITS.pickup_for(timedelta(seconds=5)), None)
        self.queue_has_message = False
        self.worker: str = "none"  # none | working | finished | failed | died
        self.store_up = True
        self.cancelled_at: datetime | None = None
        self.computed_after_cancel = False
        self.lost = False  # the broker restarted after the message was sent

    def _apply(self, event: Event) -> None:
        status = move(self.job.status, event)
        job = self.job
        if event is Event.REQUEUED:
            self.job = JobClock(status, False, job.attempts, job.deadline_at, None)
        elif event is Event.SENT:
            self.lost = False
            self.job = JobClock(status, True, job.attempts + 1, job.deadline_at or self.now + LIMITS.pickup, None)
        elif event is Event.STARTED:
            self.job = JobClock(status, True, job.attempts, deadline_after(event, self.now, LIMITS), self.now)
        elif event is Event.BEAT:
            self.job = JobClock(status, True, job.attempts, deadline_after(event, self.now, LIMITS), job.started_at)
        elif event is Event.HANDED_BACK:
            self.job = JobClock(status, False, job.attempts, deadline_after(event, self.now, LIMITS), None)
            self.worker = "none"
        else:
            self.job = JobClock(status, job.sent, job.attempts, None, job.started_at)

    def _seen(self) -> Seen:
        if not self.store_up:
            return Seen.UNKNOWN
        return {
            "none": Seen.NOTHING,
            "working": Seen.WORKING,
            "finished": Seen.SUCCEEDED,
            "failed": Seen.FAILED,
            "died": Seen.NOTHING,
        }[self.worker]

    @rule(seconds=st.integers(1, 90))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @precondition(lambda self: self.job.status is Q and not self.job.sent)
    @rule(broker_up=st.booleans())
    def outbox_sends(self, broker_up: bool) -> None:
        if broker_up:
            self._apply(Event.SENT)
            self.queue_has_message = True

    @precondition(lambda self: self.queue_has_message)
    @rule()
    def broker_restarts_and_loses_the_message(self) -> None:
        self.queue_has_message = False
        self.lost = True

    @precondition(lambda self: self.queue_has_message and self.worker == "none")
    @rule()
    def a_worker_takes_it(self) -> None:
        self.queue_has_message = False
        if self.job.status not in IN_FLIGHT:  # the worker checks the cancel mark first: dropped
            return
        self.worker = "working"

    @precondition(lambda self: self.worker == "working")
    @rule(outcome=st.sampled_from(["finished", "failed", "died"]))
    def the_worker_ends(self, outcome: str) -> None:
        if self.cancelled_at is not None and outcome == "finished":
            self.computed_after_cancel = True
        self.worker = outcome

    @rule(up=st.booleans())
    def result_store_flips(self, up: bool) -> None:
        self.store_up = up

    @precondition(lambda self: self.job.status in IN_FLIGHT)
    @rule()
    def player_cancels(self) -> None:
        self._apply(Event.CANCELLED)
        self.cancelled_at = self.now
        if self.worker == "working":
            self.worker = "died"  # stopped at its next denoising step: nothing is stored

    @rule()
    def supervisor_ticks(self) -> None:
        event = next_event(self.job, self._seen(), self.now, LIMITS)
        if event is not None:
            self._apply(event)

    @invariant()
    def in_flight_jobs_have_a_deadline(self) -> None:
        if self.job.status in IN_FLIGHT:
            assert self.job.deadline_at is not None

    @invariant()
    def nothing_is_computed_after_a_cancel(self) -> None:
        assert not self.computed_after_cancel

    def teardown(self) -> None:
        # From here the store answers and the outbox sends, but every worker that takes the turn
        # dies with it (the worst that can go on for ever). A bounded number of ticks must still
        # end the job.
        self.store_up = True
        for _ in range(20):
            if self.job.status in FINAL:
                return
            if self.job.status is Q and not self.job.sent:
                self._apply(Event.SENT)
                self.queue_has_message = True
            if self.queue_has_message and self.worker == "none":
                self.a_worker_takes_it()
            for _ in range(2):  # the claim is seen, then it lapses
                event = next_event(self.job, self._seen(), self.now, LIMITS)
                if event is not None:
                    self._apply(event)
                if self.worker == "working":
                    self.worker = "died"
                self.now += LIMITS.claim * 2
        raise AssertionError(f"the job never ended: {self.job}")


TestJobLife = JobLife.TestCase
TestJobLife.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
