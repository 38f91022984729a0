"""Each role installs what it runs: the bot's install has no torch, and the bot runs without it."""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.workers import REPO

PROJECT = "animegamer-discord"
MODEL_LIBRARIES = {"torch", "transformers", "diffusers", "accelerate", "peft", "safetensors", "opencv-python-headless"}


def closure(project: str, extras: set[str]) -> set[str]:
    """Every distribution ``pip install project[extras]`` brings, read from the installed metadata."""
    found: set[str] = set()
    pending = [(project, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, wanted = pending.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        found.add(canonicalize_name(name))
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in wanted or {""}):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def test_the_bot_install_brings_no_model_library() -> None:
    bot = closure(PROJECT, {"bot"})
    assert {"discord-py", "celery", "sqlalchemy", "av"} <= bot
    assert bot.isdisjoint(MODEL_LIBRARIES), sorted(bot & MODEL_LIBRARIES)


def test_the_worker_install_brings_the_model_libraries_and_no_discord() -> None:
    worker = closure(PROJECT, {"worker"})
    assert {"torch", "transformers", "diffusers"} <= worker
    assert "discord-py" not in worker


def modules_outside(extras: set[str]) -> set[str]:
    """Every importable top-level module that ``pip install project[extras]`` would not bring."""
    allowed = closure(PROJECT, extras)
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in allowed for d in distributions)
    }


def blocking(modules: set[str]) -> str:
    """Code that makes ``modules`` unimportable, as if they were not installed."""
    return f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(modules)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (a bot-only install)")
sys.meta_path.insert(0, Absent())
"""


def test_the_bot_and_its_commands_load_with_only_what_the_bot_install_brings(tmp_path) -> None:
    outside = modules_outside({"bot"})
    assert {"torch", "transformers", "diffusers"} <= outside  # installed here, for the other roles' tests
    script = blocking(outside) + (
        "import asyncio\n"
        "from relay.settings import Settings\n"
        "from bot.app import AnimeGamerBot, EXTENSIONS\n"
        "from animegamer.cli import main\n"
        f"bot = AnimeGamerBot(Settings(data_dir={str(tmp_path)!r}))\n"
        "async def load():\n"
        "    for extension in EXTENSIONS:\n"
        "        await bot.load_extension(extension)\n"
        "    print(sorted(c.name for c in bot.tree.get_commands()))\n"
        "asyncio.run(load())\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "'act'" in run.stdout and "'story'" in run.stdout and "'admin'" in run.stdout
