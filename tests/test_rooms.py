"""The house's rooms (DESIGN.md): what moves a turn lives in `relay/` and MP4 in `media/`, which the bot and
the worker both import and which import neither; the bot imports no worker module and the worker no bot module;
no import builds a Celery app (each process makes its own from its settings)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "relay": {"bot", "worker", "db", "animegamer", "media", "torch"},
    "media": {"bot", "worker", "db", "animegamer", "relay", "torch"},
    "bot": {"worker", "torch", "transformers", "diffusers"},
    "worker": {"bot", "db"},
    "game": {"bot", "worker", "relay", "db", "animegamer"},
    "db": {"bot", "worker", "relay", "animegamer"},
}


def imported(path: Path) -> set[str]:
    """The top-level packages a file imports, anywhere in it (function bodies and TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_room_imports_none_of_the_rooms_it_must_not(room: str) -> None:
    crossings = {
        str(path.relative_to(ROOT)): sorted(imported(path) & FORBIDDEN[room])
        for path in sorted((ROOT / room).rglob("*.py"))
    }
    assert {path: names for path, names in crossings.items() if names} == {}


def test_importing_the_relay_the_bot_and_the_task_builds_no_celery_app() -> None:
    code = (
        "import celery._state as state, relay.celery_app, relay.control, relay.blob_store, relay.sqlite_broker, "
        "bot.app, worker.tasks; print(len(list(state._apps)))"
    )
    assert subprocess.check_output([sys.executable, "-c", code], text=True, cwd=ROOT).strip() == "0"


# The bot's duties that run beside discord.py, and the modules only they use.
BACKGROUND = [
    "bot/outbox.py",
    "bot/supervisor.py",
    "bot/rounds.py",
    "bot/delivery.py",
    "bot/notices.py",
    "bot/retention.py",
    "bot/leases.py",
    "bot/liveness.py",
    "bot/presence.py",
    "bot/suggestions.py",
]
# bot.buttons is not one of them: the delivery attaches its result view (Reroll, Continue) to each post it makes.
COMMAND_MODULES = ("bot.turns", "bot.cogs")


def test_background_services_import_no_command_module() -> None:
    """What a duty shares with the commands (making a turn, its texts, its limits) lives in a module of its own
    (bot/making.py, bot/cards.py, bot/outbox.py), so no duty reaches a command's code by the way."""
    crossings = {}
    for name in BACKGROUND:
        path = ROOT / name
        modules = {
            node.module
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.module
        } | {
            alias.name
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        crossings[name] = sorted(m for m in modules if m.startswith(COMMAND_MODULES))
    assert {name: found for name, found in crossings.items() if found} == {}
