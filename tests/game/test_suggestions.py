"""What autocomplete offers for a motion or a background, from what is typed."""

from __future__ import annotations

from game.suggestions import MAX_CHOICES, most_played, suggest, vocabulary_for

KNOWN = ("gently fly on broomstick", "quickly run", "gently wave to a friend", "slowly fly on broomstick")


def test_every_word_typed_must_be_in_a_suggestion():
    assert suggest("fly gent", [], KNOWN) == ["gently fly on broomstick"]


def test_words_that_start_as_typed_come_before_words_that_contain_it():
    assert suggest("l", [], ("quickly run", "gently wave", "lie down")) == ["lie down", "quickly run", "gently wave"]


def test_the_servers_most_played_come_first_and_once():
    assert suggest("", ["quickly run", "happily juggle"], KNOWN)[:3] == ["quickly run", "happily juggle", KNOWN[0]]
    assert suggest("", ["Quickly Run"], KNOWN).count("quickly run") == 0  # the same motion is offered once


def test_at_most_twenty_five_are_offered():
    assert len(suggest("", [], vocabulary_for("toy").motions)) == MAX_CHOICES


def test_most_played_adds_up_lines_by_motion_and_by_background_and_skips_broken_ones():
    lines = [
        ("Character: Qiqi; Motion: gently dance; Background: night town.", 2),
        ("Character: Momo; Motion: gently dance; Background: day sky.", 2),
        ("Character: Qiqi; Motion: quickly run; Background: day sky.", 3),
        ("not an instruction", 9),
    ]
    assert most_played(lines) == (["gently dance", "quickly run"], ["day sky", "night town"])


def test_the_published_model_suggests_its_demo_vocabulary():
    release = vocabulary_for("animegamer")
    assert "gently fly on broomstick" in release.motions and "night bedroom" in release.backgrounds
    assert "run around" not in " ".join(release.motions)  # a toy-world action the release never showed
