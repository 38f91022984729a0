"""/mydata: a player sees, takes and erases what the game keeps about them, across every server, in any server or
in DMs (Discord's Developer Terms: an easily accessible way to ask for deletion, done when asked).

What each piece is and how long it is kept is docs/privacy.md; which rows go and which stay is db/privacy.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import zipfile
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.confirm import Confirm
from bot.errors import Refusal, defer_privately, fill
from bot.privacy import after_deletion, cancel_sent, deleted_text
from bot.retention import retention_text
from db import privacy

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

DELETE_COOLDOWN_SECONDS = 600.0  # a deletion walks every server's rows: one per player per 10 minutes per process


@app_commands.allowed_contexts(guilds=True, dms=True, private_channels=True)
class MyData(commands.GroupCog, group_name="mydata", group_description="What the game keeps about you"):
    def __init__(self, bot: AnimeGamerBot) -> None:
        self.bot = bot
        self._deleted_at: dict[int, float] = {}  # user id -> monotonic time of their last deletion

    @app_commands.command(name="show", description="What the game keeps about you, in every server")
    async def show(self, interaction: discord.Interaction) -> None:
        await defer_privately(interaction)
        async with self.bot.sessions() as session:
            mine = await privacy.collect(session, interaction.user.id)
        await fill(interaction, shown_text(mine, retention_text(self.bot.settings)), ephemeral=True)

    @app_commands.command(name="export", description="All the game keeps about you as a file, with your clips")
    async def export(self, interaction: discord.Interaction) -> None:
        await defer_privately(interaction)
        async with self.bot.sessions() as session:
            mine = await privacy.collect(session, interaction.user.id)
        limit = interaction.filesize_limit - 64 * 1024
        # Reading clips from the store and zipping them blocks: off the event loop.
        archive, left_out = await asyncio.to_thread(export_zip, mine, self.bot.clips, limit)
        note = f" {left_out} clip(s) did not fit in one file; ask again after deleting some." if left_out else ""
        name = f"animegamer_{interaction.user.id}.zip"
        text = "Everything the game keeps about you: `data.json`, and your clips in `clips/`." + note
        await fill(interaction, text, file=discord.File(io.BytesIO(archive), name), ephemeral=True)

    @app_commands.command(name="delete", description="Delete everything the game keeps about you, in every server")
    async def delete(self, interaction: discord.Interaction) -> None:
        user_id = interaction.user.id
        last = self._deleted_at.get(user_id)
        if last is not None and time.monotonic() - last < DELETE_COOLDOWN_SECONDS:
            again = int(time.time() + DELETE_COOLDOWN_SECONDS - (time.monotonic() - last))
            raise Refusal(f"Your data was deleted just now; you can ask again <t:{again}:R>.")
        view = Confirm(user_id, yes=("Delete everything", "Deleting…"), no=("Keep it", "Nothing was deleted."))
        await interaction.response.send_message(
            "Delete your characters, turns, clips, proposals, votes and reports in every server? This cannot be "
            "undone. A ban a server placed on you stays, as a bare id.",
            view=view,
            ephemeral=True,
        )
        await view.wait()
        if not view.confirmed:
            return
        self._deleted_at[user_id] = time.monotonic()
        async with self.bot.sessions() as session, session.begin():
            deleted = await privacy.delete_user(session, user_id)
        left = await after_deletion(self.bot, deleted.clip_keys, deleted.copies, deleted.stories)
        said = "Deleted everything the game kept about you, and " + deleted_text(
            len(deleted.clip_keys), left, deleted.copies
        )
        await interaction.followup.send(said, ephemeral=True)
        await cancel_sent(self.bot.queue, deleted.task_ids)


def shown_text(mine: dict[str, Any], kept: str) -> str:
    servers = len(mine["servers"])
    if not servers and not any(mine[k] for k in ("stories_started", "banned_in", "admin_actions")):
        return "The game keeps nothing about you."
    clips = sum(1 for turn in mine["turns"] if turn["clip_key"])
    names = sorted({c["name"] for c in mine["characters"]})
    lines = [
        f"In {servers} server(s): {len(mine['characters'])} character(s) ({', '.join(names) or 'none'}), "
        f"{len(mine['turns'])} turn(s), {clips} of them with a stored clip.",
        f"Stories you started: {len(mine['stories_started'])}; proposals: {len(mine['proposals'])}; "
        f"votes: {len(mine['votes'])}; clips you reported: {len(mine['reports_made'])}.",
        f"Banned in {len(mine['banned_in'])} server(s); admin actions you took: {len(mine['admin_actions'])}.",
        f"{kept}. `/mydata export` gives you all of it, `/mydata delete` erases it.",
    ]
    return "\n".join(lines)


def export_zip(mine: dict[str, Any], store, limit: int) -> tuple[bytes, int]:
    """``data.json`` and the stored clips, newest first, as many as fit under ``limit`` bytes; and how many did not."""
    out = io.BytesIO()
    left_out = 0
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:  # MP4s do not compress
        archive.writestr("data.json", json.dumps(mine, indent=2, default=str))
        for number, turn in reversed(list(enumerate(mine["turns"], start=1))):
            if not turn["clip_key"]:
                continue
            try:
                clip = store.get(turn["clip_key"])
            except OSError:  # gone, or the store is down: the data says which turn had it
                left_out += 1
                continue
            if out.tell() + len(clip) + 1024 > limit:
                left_out += 1
                continue
            archive.writestr(f"clips/turn_{number}.mp4", clip)
    return out.getvalue(), left_out


async def setup(bot: AnimeGamerBot) -> None:
    await bot.add_cog(MyData(bot))
