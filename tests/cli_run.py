"""`animegamer ARGS` run in the test's own process: the same ``main`` a user's command runs, its exit status and what
it printed, without a second interpreter importing torch, transformers and diffusers again (6 CPU-s a run here).

For commands that start nothing and hold no state between runs (``checkpoints check``, ``inspect-prompt``,
``--help``); commands that start a worker or are stopped by a signal run as subprocesses (tests/cli/test_demo.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from animegamer.cli import main
from relay.settings import get_settings


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Ran:
    """In ``cwd`` (a fresh folder: no .env of the checkout is read) with no ANIMEGAMER_ setting of the caller's."""
    for name in [name for name in os.environ if name.startswith("ANIMEGAMER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(cwd)
    capsys.readouterr()  # what the test printed before is not the command's
    get_settings.cache_clear()
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse: --help, or arguments it cannot read
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr()
    return Ran(code, out.out, out.err)
