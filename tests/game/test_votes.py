"""Which proposal a vote round plays."""

from __future__ import annotations

from game.votes import tally, winner


def test_the_proposal_with_the_most_votes_wins():
    assert winner(tally([10, 11, 12], [12, 11, 12])) == 12


def test_a_tie_goes_to_the_earliest_proposal():
    assert winner(tally([10, 11, 12], [12, 11, 11, 12])) == 11


def test_a_round_nobody_voted_in_plays_its_first_proposal():
    assert winner(tally([10, 11], [])) == 10


def test_a_round_without_proposals_plays_nothing():
    assert winner(tally([], [])) is None


def test_the_tally_lists_every_proposal_in_order_with_its_votes():
    assert tally([10, 11, 12], [12, 12]) == [(10, 0), (11, 0), (12, 2)]
