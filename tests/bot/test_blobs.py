"""Clips and representations between the bot and its workers through the shared blob folder, caused for real."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from db.models import AuditLog, Character, Job, JobStatus
from tests.bot.conftest import running_bot, settings_beside, wait_for_db
from tests.bot.helpers import accepted, private_text
from tests.discord_double import DiscordDouble
from tests.workers import settings_for

pytestmark = pytest.mark.slow

WAVE = {"motion": "gently wave", "background": "day town"}


async def test_a_bot_that_does_not_share_the_workers_blob_folder_fails_the_turn_naming_the_file(
    sqlite_worker, tmp_path: Path
):
    settings = settings_beside(sqlite_worker, tmp_path, blob_dir=tmp_path / "not-the-workers")
    assert settings_for(sqlite_worker.env).inline_max_bytes < 30_000  # the tiny clip goes by reference
    async with DiscordDouble() as double, running_bot(double, settings, sqlite_worker):
        assert "You play" in private_text(await (await double.slash("start", {"character": "Qiqi"})).answer())
        handle = await double.slash("act", WAVE)
        await accepted(handle)
        await wait_for_db(settings, select(Job.status), lambda rows: rows[0][0] == JobStatus.FAILED, timeout=90)
        await double.wait_until(lambda: "could not be made" in handle.original.content, 15, "the failure notice")
        ((details,),) = await wait_for_db(settings, select(AuditLog.details), lambda rows: bool(rows))
        ((error,),) = await wait_for_db(settings, select(Job.error), lambda rows: True)
        ((stamina,),) = await wait_for_db(settings, select(Character.stamina), lambda rows: True)
    assert "missing" in error and str(tmp_path / "not-the-workers") in error  # the operator learns which file
    assert details.endswith("the worker's result cannot be read") and str(tmp_path) not in details  # admins: no path
    assert stamina == 50
