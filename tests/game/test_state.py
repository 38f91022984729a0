import pytest
from pydantic import ValidationError

from game.motion import flow_for
from game.state import CharacterState, StateDeltas, stat_colour


def deltas(motion=0, social=0, entertainment=0, stamina=0):
    return StateDeltas(motion=motion, social=social, entertainment=entertainment, stamina=stamina)


def test_a_new_character_starts_at_fifty_everywhere():
    assert CharacterState() == CharacterState(stamina=50, social=50, entertainment=50)


def test_each_unit_of_change_moves_a_stat_by_five():
    state = CharacterState().apply(deltas(stamina=-2, social=3, entertainment=1))
    assert (state.stamina, state.social, state.entertainment) == (40, 65, 55)


def test_motion_level_changes_no_stat():
    assert CharacterState().apply(deltas(motion=5)) == CharacterState()


def test_stats_stay_within_zero_and_a_hundred():
    state = CharacterState(stamina=95, social=3, entertainment=50).apply(deltas(stamina=5, social=-5))
    assert (state.stamina, state.social) == (100, 0)


def test_deltas_outside_minus_five_to_five_are_refused():
    with pytest.raises(ValidationError):
        deltas(stamina=6)


@pytest.mark.parametrize(
    ("level", "flow"), [(1, 0.5), (2, 2.5), (3, 10.0), (4, 15.0), (5, 40.0), (0, 40.0), (-3, 40.0)]
)
def test_motion_level_maps_to_the_release_flow_table(level, flow):
    assert flow_for(level) == flow


@pytest.mark.parametrize(("value", "colour"), [(0, "red"), (29, "red"), (30, "yellow"), (60, "yellow"), (61, "green")])
def test_bars_are_coloured_as_the_release_app_does(value, colour):
    assert stat_colour(value) == colour
