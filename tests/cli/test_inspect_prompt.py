"""`animegamer inspect-prompt` through the command's own ``main``: ids on stdout, errors on stderr, its exit status."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_run import Ran, run_cli
from tests.pipeline.test_tokenizer_parity import TOKENIZER_DIR, load_release_tokenizer, release_prompt_ids

NOW = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
FIRST_DEMO_LINE = "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky."
PAST = [
    {"instruction": "Character: Qiqi; Motion: gently sit on railing; Background: day town.",
     "deltas": {"motion": 1, "social": 2, "entertainment": -1, "stamina": -3}},
    {"instruction": "Character: Qiqi; Motion: gently turn head; Background: day town.",
     "deltas": {"motion": -5, "social": 0, "entertainment": 5, "stamina": 4}},
]  # fmt: skip


@pytest.fixture
def inspect_prompt(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Ran]:
    def run(*args: str, cwd: Path) -> Ran:
        return run_cli("inspect-prompt", *args, cwd=cwd, capsys=capsys, monkeypatch=monkeypatch)

    return run


@pytest.fixture
def tokenizer_dir() -> Path:
    if not (TOKENIZER_DIR / "tokenizer.model").is_file():
        pytest.skip(reason=f"the release's tokenizer files are not at {TOKENIZER_DIR}")
    return TOKENIZER_DIR


def ids_from(done: Ran) -> list[int]:
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, "the ids are one JSON line"
    return json.loads(lines[0])


def test_first_demo_line_prints_the_release_ids(
    inspect_prompt: Callable[..., Ran], tokenizer_dir: Path, tmp_path: Path
) -> None:
    ids = ids_from(inspect_prompt("--tokenizer", str(tokenizer_dir), FIRST_DEMO_LINE, cwd=tmp_path))
    assert len(ids) == 254
    assert ids == release_prompt_ids(load_release_tokenizer(), FIRST_DEMO_LINE)


def test_history_as_json_lines_or_a_list_gives_the_release_ids(
    inspect_prompt: Callable[..., Ran], tokenizer_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "past.jsonl").write_text("\n".join(json.dumps(turn) for turn in PAST) + "\n\n")
    (tmp_path / "past.json").write_text(json.dumps(PAST, indent=2))
    from_lines = ids_from(
        inspect_prompt("--tokenizer", str(tokenizer_dir), "--history-file", "past.jsonl", NOW, cwd=tmp_path)
    )
    from_list = ids_from(
        inspect_prompt("--tokenizer", str(tokenizer_dir), "--history-file", "past.json", NOW, cwd=tmp_path)
    )
    order = ("motion", "social", "entertainment", "stamina")  # the release's ML, SC, ET, ST
    past = [(turn["instruction"], tuple(turn["deltas"][k] for k in order)) for turn in PAST]
    assert from_lines == from_list == release_prompt_ids(load_release_tokenizer(), NOW, past)


def test_instruction_is_used_in_canonical_form(
    inspect_prompt: Callable[..., Ran], tokenizer_dir: Path, tmp_path: Path
) -> None:
    sloppy = "character : Qiqi ;motion:  GENTLY fly on broomstick;background: night   sky"
    assert ids_from(inspect_prompt("--tokenizer", str(tokenizer_dir), sloppy, cwd=tmp_path)) == ids_from(
        inspect_prompt("--tokenizer", str(tokenizer_dir), NOW, cwd=tmp_path)
    )


def test_bad_instruction_gives_the_grammar_error_and_exit_2(inspect_prompt: Callable[..., Ran], tmp_path: Path) -> None:
    done = inspect_prompt("--tokenizer", str(tmp_path / "absent"), "Qiqi flies", cwd=tmp_path)
    assert done.returncode == 2
    assert "semicolons" in done.stderr and "Expected: `Character: Qiqi;" in done.stderr
    assert done.stdout == ""


def test_markup_in_the_instruction_is_refused_with_exit_2(inspect_prompt: Callable[..., Ran], tmp_path: Path) -> None:
    done = inspect_prompt(
        "--tokenizer", str(tmp_path), "Character: Qiqi; Motion: fly</frame>; Background: night sky.", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "Motion contains '<'" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"instruction": "nonsense", "deltas": {}}', "past.jsonl line 1: Write the three labelled parts"),
        (json.dumps([{**PAST[0], "deltas": {**PAST[0]["deltas"], "stamina": 6}}]), "past.jsonl entry 1: deltas"),
        ('{"instruction": "x"', "past.jsonl line 1: not JSON"),
        ('[{"deltas": {}}]', 'expected {"instruction"'),
        ("\n".join(json.dumps(PAST[0]) for _ in range(5)), "holds 5 past turns; a prompt holds at most 4"),
    ],
)
def test_bad_history_file_is_refused_with_exit_2(
    inspect_prompt: Callable[..., Ran], tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / "past.jsonl").write_text(content)
    done = inspect_prompt("--tokenizer", str(tmp_path), "--history-file", "past.jsonl", NOW, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr


def test_missing_history_file_is_refused_with_exit_2(inspect_prompt: Callable[..., Ran], tmp_path: Path) -> None:
    done = inspect_prompt("--tokenizer", str(tmp_path), "--history-file", "absent.jsonl", NOW, cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot read the history file absent.jsonl" in done.stderr


def test_missing_tokenizer_names_the_file_and_exits_1(inspect_prompt: Callable[..., Ran], tmp_path: Path) -> None:
    done = inspect_prompt("--tokenizer", str(tmp_path), NOW, cwd=tmp_path)
    assert done.returncode == 1
    assert f"{tmp_path / 'tokenizer.model'}" in done.stderr
    assert "Mistral-7B-Instruct-v0.1 directory" in done.stderr
    assert done.stdout == ""
