import pytest
from pydantic import ValidationError

from game.contract import CONTRACT_VERSION, BlobRef, HistoryTurn, TurnRequest, TurnResult, UnresolvedBlob, inline
from game.history import past_turns_for
from game.safety import SafetyReport
from game.state import StateDeltas
from tests.results import turn_result

LINE = "Character: Qiqi; Motion: gently lie down; Background: day grass."
ZERO = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)


def test_the_released_window_of_one_feeds_no_past_turns():
    assert past_turns_for([1, 2, 3]) == []


def test_a_window_of_three_feeds_the_two_latest_turns_oldest_first():
    assert past_turns_for([1, 2, 3, 4], window=3) == [3, 4]


def test_a_window_beyond_the_trained_five_is_refused():
    with pytest.raises(ValueError, match=r"1\.\.5"):
        past_turns_for([1], window=6)


def test_a_request_carries_the_canonical_instruction():
    request = TurnRequest(
        job_id="1", instruction="character: Qiqi;motion: gently lie down;background: day grass", seed=1
    )
    assert request.instruction == LINE


def test_a_request_with_a_malformed_instruction_is_refused():
    with pytest.raises(ValidationError):
        TurnRequest(job_id="1", instruction="lie down", seed=1)


def test_a_request_survives_json_with_its_history_bytes():
    history = [HistoryTurn(instruction=LINE, representation=b"\x00\xffbytes", deltas=ZERO)]
    request = TurnRequest(job_id="7", instruction=LINE, seed=3, history=history)
    assert TurnRequest.model_validate_json(request.model_dump_json()) == request
    assert TurnRequest.model_validate(request.model_dump(mode="json")) == request


def test_a_request_from_another_contract_version_is_refused():
    data = TurnRequest(job_id="1", instruction=LINE, seed=1).model_dump(mode="json")
    data["version"] = CONTRACT_VERSION + 1
    with pytest.raises(ValidationError, match="same release"):
        TurnRequest.model_validate(data)


def test_a_request_of_the_first_contract_version_is_refused_as_another_release():
    """Version 1 carried every blob inline; its workers cannot read references."""
    data = TurnRequest(job_id="1", instruction=LINE, seed=1).model_dump(mode="json") | {"version": 1}
    with pytest.raises(
        ValidationError, match=f"contract version 1 reached a side that speaks version {CONTRACT_VERSION}"
    ):
        TurnRequest.model_validate(data)


def test_a_result_of_the_second_contract_version_is_refused_as_another_release():
    """Version 2 results carried no safety report: a bot of this release would have no word on their clips."""
    data = turn_result(1).model_dump(mode="json") | {"version": 2}
    with pytest.raises(
        ValidationError, match=f"contract version 2 reached a side that speaks version {CONTRACT_VERSION}"
    ):
        TurnResult.model_validate(data)


def test_a_result_must_carry_a_safety_report():
    data = turn_result(1).model_dump(mode="json")
    del data["safety"]
    with pytest.raises(ValidationError, match="safety"):
        TurnResult.model_validate(data)


def test_a_past_representation_may_cross_as_a_blob_reference():
    ref = BlobRef(sha256="0f" * 32, size=868_000)
    history = [HistoryTurn(instruction=LINE, representation=ref, deltas=ZERO)]
    request = TurnRequest(job_id="7", instruction=LINE, seed=3, history=history)
    assert TurnRequest.model_validate(request.model_dump(mode="json")).history[0].representation == ref


def test_a_blob_reference_names_a_sha256_and_nothing_else():
    with pytest.raises(ValidationError):
        BlobRef(sha256="../../etc/passwd", size=1)


def test_bytes_are_needed_where_a_reference_still_stands_is_a_clear_error():
    with pytest.raises(UnresolvedBlob, match="the clip is still a blob reference"):
        inline(BlobRef(sha256="0f" * 32, size=1), "the clip")


def test_a_result_survives_json_with_its_clip_bytes():
    result = TurnResult(
        job_id="1",
        model="tiny",
        label="tiny model, random weights",
        seed=1,
        deltas=ZERO,
        flow=40.0,
        mp4=b"\x00\x00\x00\x18ftypmp42",
        representation=b"st",
        num_frames=17,
        height=64,
        width=96,
        fps=8,
        safety=SafetyReport(detector="nudenet", scores={"FACE_FEMALE": 0.81, "BUTTOCKS_EXPOSED": 0.02}, frames=17),
    )
    assert TurnResult.model_validate(result.model_dump(mode="json")) == result


def test_a_workers_progress_survives_the_store_as_json_and_reads_back_as_its_stage():
    import json

    from game.contract import Progress, Stage

    stored = json.loads(json.dumps(Progress(stage=Stage.DENOISE, step=3, total=20).model_dump(mode="json")))
    assert stored == {"stage": "denoise", "step": 3, "total": 20}
    assert Progress.read(stored) == Progress(stage=Stage.DENOISE, step=3, total=20)


@pytest.mark.parametrize("meta", [None, "denoise", {"stage": "dreaming", "step": 1, "total": 2}, {"stage": "vae"}])
def test_progress_that_is_not_a_progress_reads_as_none(meta):
    from game.contract import Progress

    assert Progress.read(meta) is None
