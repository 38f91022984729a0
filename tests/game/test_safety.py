"""The safety rules: which clips are flagged, and where a server's policy lets a flagged clip go."""

from __future__ import annotations

import pytest

from game.safety import SafetyPolicy, SafetyReport, judge, unchecked

WITHHOLD, AGE_RESTRICTED = SafetyPolicy.WITHHOLD, SafetyPolicy.AGE_RESTRICTED


def report(**scores: float) -> SafetyReport:
    return SafetyReport(detector="test", scores=scores, frames=17)


def test_only_exposed_nudity_labels_flag_a_clip() -> None:
    covered = report(FACE_FEMALE=0.99, FEMALE_BREAST_COVERED=0.95, FEET_EXPOSED=0.9, BELLY_EXPOSED=0.9)
    assert judge(covered, 0.5, WITHHOLD, False).post


def test_a_score_at_the_threshold_flags_and_just_under_it_does_not() -> None:
    assert not judge(report(ANUS_EXPOSED=0.5), 0.5, WITHHOLD, False).post
    assert judge(report(ANUS_EXPOSED=0.4999), 0.5, WITHHOLD, False).post


def test_the_highest_unsafe_label_is_named() -> None:
    verdict = judge(report(BUTTOCKS_EXPOSED=0.6, MALE_GENITALIA_EXPOSED=0.7), 0.5, WITHHOLD, True)
    assert not verdict.post and verdict.flagged and "male genitalia exposed, 0.70" in verdict.why


@pytest.mark.parametrize(("age_restricted", "posted"), [(True, True), (False, False)])
def test_under_age_restricted_a_flagged_clip_goes_only_to_age_restricted_channels(age_restricted, posted) -> None:
    verdict = judge(report(FEMALE_BREAST_EXPOSED=0.9), 0.5, AGE_RESTRICTED, age_restricted)
    assert verdict.post is posted and verdict.flagged


@pytest.mark.parametrize("policy", list(SafetyPolicy))
def test_an_unchecked_clip_is_withheld_under_every_policy_and_in_every_channel(policy) -> None:
    for age_restricted in (True, False):
        verdict = judge(unchecked("no detector"), 0.5, policy, age_restricted)
        assert not verdict.post and "could not be checked (no detector)" in verdict.why
    assert not judge(SafetyReport(detector="test", frames=0), 0.5, policy, True).post  # no frame looked at
