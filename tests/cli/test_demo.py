"""`animegamer demo` and friends, run as a user runs them: subprocesses on a fresh data folder."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import pytest

from media.mp4 import decode_mp4
from tests.cli_run import run_cli
from tests.workers import REPO, worker_env

TWO_LINES = (
    "Character: Qiqi; Motion: quickly flying on broomstick; Background: day sky.\n"
    "# a comment, then a blank line\n\n"
    "Character: Qiqi; Motion: gently lie down; Background: night bedroom.\n"
)


def animegamer(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "animegamer", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def processes_with(data_dir: Path) -> list[int]:
    """PIDs of live processes started with this data folder in their environment (the demo's worker)."""
    marker = f"ANIMEGAMER_DATA_DIR={data_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_the_demo_on_a_two_line_file_writes_its_clips_and_story_page(tmp_path):
    (tmp_path / "story.txt").write_text(TWO_LINES)
    out = tmp_path / "out"
    done = animegamer(
        "demo", "--instructions", str(tmp_path / "story.txt"), "--out", str(out), env=worker_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["story.html", "turn_01.mp4", "turn_02.mp4"]
    for clip in ("turn_01.mp4", "turn_02.mp4"):
        assert decode_mp4((out / clip).read_bytes()).shape == (17, 64, 96, 3)
    page = (out / "story.html").read_text()
    assert "quickly flying on broomstick" in page and "gently lie down" in page
    assert page.count("<video") == 2
    assert "tiny model, random weights" in page
    assert "Complete: 2 turns" in page


@pytest.mark.slow
def test_the_default_model_is_the_trained_toy_model_and_the_page_says_so(tmp_path):
    (tmp_path / "story.txt").write_text(TWO_LINES)
    # As a user runs it: the default model, and torch free to use every core (a worker that forked after
    # torch started its threads once hung here, which one thread per process hid).
    env = {k: v for k, v in worker_env(tmp_path).items() if k not in ("ANIMEGAMER_MODEL", "OMP_NUM_THREADS")}
    done = animegamer("demo", "--instructions", str(tmp_path / "story.txt"), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "out" / "story.html").read_text()
    assert "Model: <b>toy</b> (toy model, trained on the toy world)" in page
    assert "noise" not in page and "random weights" not in page
    assert decode_mp4((tmp_path / "out" / "turn_02.mp4").read_bytes()).shape == (17, 64, 96, 3)


def test_a_malformed_instruction_file_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "bad.txt").write_text("Character: Qiqi; Motion: fly; Background: sky.\nQiqi flies\n")
    done = animegamer(
        "demo", "--instructions", str(tmp_path / "bad.txt"), "--out", str(tmp_path), env=worker_env(tmp_path)
    )
    assert done.returncode == 2
    assert "line 2" in done.stderr and "Character: Qiqi; Motion:" in done.stderr
    assert not (tmp_path / "broker.db").exists()


def test_an_unknown_model_name_is_refused_with_the_known_ones(tmp_path):
    done = animegamer("demo", env=worker_env(tmp_path, ANIMEGAMER_MODEL="huge"))
    assert done.returncode == 1
    assert "Unknown model 'huge'" in done.stderr and "tiny" in done.stderr


def test_a_broker_that_does_not_answer_stops_the_demo_with_a_message(tmp_path):
    done = animegamer("demo", env=worker_env(tmp_path, "redis://127.0.0.1:9/0"), timeout=60)
    assert done.returncode == 1
    assert "does not answer" in done.stderr


def test_every_command_has_help(tmp_path, capsys, monkeypatch):
    for command in ([], ["demo"], ["play"], ["worker"], ["db"], ["db", "upgrade"]):
        done = run_cli(*command, "--help", cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
        assert done.returncode == 0 and "usage: animegamer" in done.stdout, command


@pytest.mark.slow
def test_ctrl_c_during_the_demo_stops_the_worker_and_leaves_only_complete_files(tmp_path):
    out = tmp_path / "out"
    env = worker_env(tmp_path)
    # The demo's 8 turns five times over: on a loaded machine the first turn (the model loading) took 17 s and the
    # other seven 2 s, all made before this test, polling, could send its Ctrl-C.
    (tmp_path / "long.txt").write_text((files("game") / "data" / "demo.txt").read_text("utf-8") * 5)
    proc = subprocess.Popen(
        [sys.executable, "-m", "animegamer", "demo", "--instructions", str(tmp_path / "long.txt"), "--out", str(out)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal starts it: a suite run as a background job (`make test &`) ignores SIGINT, and the demo,
        # rightly, would inherit that and never see the Ctrl-C this test sends.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 180
    while not (out / "turn_01.mp4").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the demo made no clip"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"the demo played on after Ctrl-C:\n{stdout[-1500:]}\n{stderr[-3000:]}")

    assert proc.returncode == 130, stderr[-2000:]
    assert "Stopped after" in stderr
    assert processes_with(tmp_path) == []
    clips = sorted(out.glob("turn_*.mp4"))
    assert 1 <= len(clips) < 40
    for clip in clips:
        assert decode_mp4(clip.read_bytes()).shape[0] == 17
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]
    assert "Stopped after" in (out / "story.html").read_text()


DROPPED_CTRL_C = """
import os, signal, time
from animegamer.local_game import stop_if_ctrl_c, watch_ctrl_c

class Connection:
    def __del__(self):  # a finalizer: Python prints an exception raised here and drops it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)

watch_ctrl_c()
Connection()
print("the KeyboardInterrupt was dropped", flush=True)
stop_if_ctrl_c()
print("played on")
"""


def test_a_ctrl_c_that_a_finalizer_dropped_still_stops_the_next_poll():
    """Seen once in CI: the demo played on after its Ctrl-C, the KeyboardInterrupt raised where it was lost."""
    done = subprocess.run(
        [sys.executable, "-c", DROPPED_CTRL_C],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert "the KeyboardInterrupt was dropped" in done.stdout, done.stderr
    assert "played on" not in done.stdout
    assert "KeyboardInterrupt" in done.stderr and done.returncode != 0


def test_db_upgrade_on_a_path_that_cannot_be_a_database_says_so(tmp_path):
    (tmp_path / "animegamer.db").mkdir()
    done = animegamer("db", "upgrade", env=worker_env(tmp_path), timeout=60)
    assert done.returncode == 1
    assert "animegamer.db" in done.stderr
    assert "Traceback" not in done.stderr


def test_db_upgrade_creates_the_database(tmp_path):
    done = animegamer("db", "upgrade", env=worker_env(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "animegamer.db").stat().st_size > 0
