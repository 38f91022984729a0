"""The real nudity detector (NudeNet's ONNX model from its wheel) over the frames this project makes.

None of the project's frames shows nudity, so every frame it flags is a false positive: over the toy model's demo
story, the tiny model's turns and the toy world's clips (at least 200 frames), none may reach the default threshold.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.safety_check import model_frames, project_frames, unsafe_scores
from game.contract import TurnRequest
from game.safety import DEFAULT_THRESHOLD, UNSAFE_LABELS
from worker.safety import LABELS, DetectorUnavailable, Missing, NudeNetChecker, load_checker


@pytest.fixture(scope="module")
def checker() -> NudeNetChecker:
    return NudeNetChecker.load(threads=1)


def test_the_detector_loads_from_its_wheel_and_names_itself(checker: NudeNetChecker) -> None:
    assert checker.name.startswith("nudenet 3.") and "320n" in checker.name
    assert isinstance(load_checker(threads=1), NudeNetChecker)


def test_a_clip_is_scored_on_every_frame_for_every_label(checker: NudeNetChecker) -> None:
    frames = np.random.default_rng(0).integers(0, 255, (5, 64, 96, 3), dtype=np.uint8)
    report = checker(frames)
    assert report.checked and report.frames == 5 and report.detector == checker.name
    assert set(report.scores) == set(LABELS) and set(report.scores) >= UNSAFE_LABELS
    assert all(0.0 <= score <= 1.0 for score in report.scores.values())


def test_a_photo_of_a_womans_face_scores_face_female_so_zeros_would_fail(checker: NudeNetChecker) -> None:
    """The positive control: a detector whose scores were all zeros (or read from the wrong channels) passes every
    clip; scikit-image's ``astronaut`` (Eileen Collins, 512x512 RGB) scores FACE_FEMALE about 0.8."""
    data = pytest.importorskip("skimage.data", reason="scikit-image ships the astronaut photo: pip install '.[test]'")
    scores = checker.scores(data.astronaut()[None])[0]
    assert scores[LABELS.index("FACE_FEMALE")] > 0.6
    assert scores[LABELS.index("FACE_FEMALE")] > 2 * scores[LABELS.index("FACE_MALE")]


def test_the_scores_are_read_in_nudenets_own_label_order() -> None:
    nudenet = pytest.importorskip("nudenet.nudenet")
    assert tuple(getattr(nudenet, "__labels")) == LABELS


def test_a_nudenet_listing_its_labels_in_another_order_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that reorders its classes would have the exposed labels read from other channels: fail closed."""
    nudenet = pytest.importorskip("nudenet.nudenet")
    monkeypatch.setattr(nudenet, "__labels", list(reversed(LABELS)))
    with pytest.raises(DetectorUnavailable, match="not in the order"):
        NudeNetChecker.load(threads=1)
    assert isinstance(load_checker(threads=1), Missing)


def test_a_detector_that_raises_fails_closed(checker: NudeNetChecker) -> None:
    """Frames it cannot read (four channels) make the model code raise: the clip is reported unchecked."""
    report = checker(np.zeros((2, 64, 96, 4), np.uint8))
    assert not report.checked and "detector failed" in (report.error or "")


def test_a_pipeline_with_no_detector_sends_its_clip_unchecked() -> None:
    from worker.pipeline.loading import load_pipeline

    pipeline = load_pipeline("tiny", device="cpu")
    line = "Character: Qiqi; Motion: gently wave; Background: day town."
    result = pipeline(TurnRequest(job_id="1", instruction=line, seed=1))
    assert not result.safety.checked and "no nudity detector" in (result.safety.error or "")


@pytest.mark.slow
@pytest.mark.timeout(600)  # eight toy turns and two tiny ones, then 442 frames through the detector on one thread
def test_none_of_the_projects_own_frames_is_flagged(checker: NudeNetChecker) -> None:
    sources = project_frames(toy_turns=8, tiny_turns=2, episodes=4)
    scores = np.concatenate([unsafe_scores(checker, clips) for clips in sources.values()])
    assert len(scores) >= 200
    flagged = int((scores >= DEFAULT_THRESHOLD).sum())
    print(
        f"\n{flagged} of {len(scores)} frames flagged at {DEFAULT_THRESHOLD}; highest unsafe score {scores.max():.4f}"
    )
    assert flagged == 0


COMPARED_FRAMES = 16  # frames with a box, compared score by score: all 136 took 20 s of the suite for no more proof


@pytest.mark.slow
def test_its_scores_are_nudenets_own_for_the_same_pixels(checker: NudeNetChecker) -> None:
    """NudeNet 3.4's ``detect`` feeds a 3-channel image to its model channel-swapped (worker/safety.py): fed the same
    swapped frame, our scores are the scores its boxes carry."""
    nudenet = pytest.importorskip("nudenet")
    detector = nudenet.NudeDetector()
    clips, _ = model_frames("toy", 8)
    compared = 0
    for frame in (frame for clip in clips for frame in clip):
        if compared == COMPARED_FRAMES:
            break
        swapped = np.ascontiguousarray(frame[:, :, ::-1])
        boxes = detector.detect(swapped)
        if not boxes:
            continue
        ours = checker.scores(swapped[None])[0]
        for box in boxes:  # NMS keeps each label's best box among others: ours is at least it, and equal for the best
            assert ours[LABELS.index(box["class"])] >= box["score"] - 1e-3
        best = max(boxes, key=lambda box: box["score"])
        assert ours[LABELS.index(best["class"])] == pytest.approx(best["score"], abs=1e-3)
        compared += 1
    assert compared > 0, "no frame of the toy demo gave NudeNet a box to compare"
