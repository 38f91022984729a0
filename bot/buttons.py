"""The buttons under every posted turn and the Continue form: registered by the app, used by the delivery.

The five result buttons are one ``DynamicItem``: the job id and the action live in the custom
id (``ag:turn:<job>:<action>``), so they work on any message after any restart without a view
being kept in memory. Each re-reads the job from the database and checks it belongs to this
server (and, for Reroll, Continue and Delete, to this player) before doing anything. A vote round's buttons are
beside these, in bot/votes.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import discord

from bot.errors import Refusal, defer_privately, fill, refuse_or_raise
from bot.reports import take_down_clip
from bot.turns import TurnInput, submit_turn
from db import reports
from db.jobs import turn_of_job
from db.models import Job, JobKind, Story, Turn
from game.safety import SafetyReport

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot


async def _job_for(interaction: discord.Interaction, job_id: int, *, owner_only: bool) -> tuple[Job, Turn]:
    bot: AnimeGamerBot = interaction.client
    found = None
    if 0 < job_id < 2**63:  # a forged custom id may hold any number; the column is a signed 64-bit int
        async with bot.sessions() as session:
            found = await turn_of_job(session, job_id)
    if found is None:
        raise Refusal("That turn no longer exists (it may have been purged).")
    job, turn, _ = found
    if job.guild_id != interaction.guild_id:
        raise Refusal("That button belongs to a turn on another server.")
    if owner_only and job.user_id != interaction.user.id:
        raise Refusal("Only the player who took this turn can use that button.")
    return job, turn


async def _story_of(bot: AnimeGamerBot, turn: Turn) -> Story | None:
    if turn.story_id is None:
        return None
    async with bot.sessions() as session:
        return await session.get(Story, turn.story_id)


async def reroll(interaction: discord.Interaction, job_id: int) -> None:
    """Same instruction, new seed: a new turn."""
    bot: AnimeGamerBot = interaction.client
    _, turn = await _job_for(interaction, job_id, owner_only=True)
    typed = TurnInput(instruction=turn.instruction)
    await submit_turn(bot, interaction, typed, story=await _story_of(bot, turn), kind=JobKind.REROLL)


async def continue_(interaction: discord.Interaction, job_id: int) -> None:
    """A modal prefilled with this turn's instruction, to write the next one."""
    _, turn = await _job_for(interaction, job_id, owner_only=True)
    await interaction.response.send_modal(ContinueModal(job_id, turn.instruction))


async def details(interaction: discord.Interaction, job_id: int) -> None:
    """Seed, model and timings, for the curious; only the one who asks sees them."""
    job, turn = await _job_for(interaction, job_id, owner_only=False)
    timings = json.loads(turn.timings or "{}")
    lines = [f"Job {job.id}, seed {turn.seed}, model {turn.model}, flow {turn.flow}"]
    lines += [f"{stage}: {seconds:.2f} s" for stage, seconds in timings.items()]
    if turn.safety:
        report = SafetyReport.model_validate_json(turn.safety)
        label, score = report.unsafe()
        checked = f"checked by {report.detector}: highest nudity score {score:.2f}" if report.checked else "not checked"
        lines.append(f"clip {checked}" + (f" ({label.lower()})" if label and report.checked else ""))
    if turn.clip_withheld:
        lines.append(f"clip withheld: {turn.clip_withheld}")
    if turn.clip_removed_at is not None:
        lines.append(f"clip taken down <t:{int(turn.clip_removed_at.timestamp())}:R>")
    if turn.clip_expired_at is not None:
        lines.append(f"clip expired <t:{int(turn.clip_expired_at.timestamp())}:R> (the bot keeps clips for a while)")
    if job.started_at and job.finished_at:
        lines.append(f"from start to done: {(job.finished_at - job.started_at).total_seconds():.1f} s")
    await interaction.response.send_message("\n".join(lines), ephemeral=True)


async def report(interaction: discord.Interaction, job_id: int) -> None:
    """Any member may report a clip to the server's admins, once; they see it in /admin reports."""
    bot: AnimeGamerBot = interaction.client
    job, turn = await _job_for(interaction, job_id, owner_only=False)
    if turn.clip_removed_at is not None:
        raise Refusal("That clip was already taken down.")
    async with bot.sessions() as session, session.begin():
        added = await reports.add_report(session, job.guild_id, turn.id, interaction.user.id)
    text = "Reported to this server's admins. Thank you." if added else "You already reported this clip."
    await interaction.response.send_message(text, ephemeral=True)


async def delete(interaction: discord.Interaction, job_id: int) -> None:
    """A player may take down their own turn's clip; the turn and the character's state stay."""
    bot: AnimeGamerBot = interaction.client
    job, turn = await _job_for(interaction, job_id, owner_only=True)
    await defer_privately(interaction)  # a Discord delete and a database write follow
    gone = await take_down_clip(bot, job, turn, actor_id=interaction.user.id, action="clip deleted by its player")
    if gone is None:
        raise Refusal("That clip was already taken down.")
    await fill(interaction, "Your clip is deleted. The turn still counts." + gone.said(), ephemeral=True)


# action -> (label, emoji, style, handler), in the order the buttons appear
ACTIONS: dict[str, tuple[str, str, discord.ButtonStyle, Callable[[discord.Interaction, int], Awaitable[None]]]] = {
    "reroll": ("Reroll", "🎲", discord.ButtonStyle.secondary, reroll),
    "continue": ("Continue", "▶️", discord.ButtonStyle.primary, continue_),
    "details": ("Details", "🔎", discord.ButtonStyle.secondary, details),
    "report": ("Report", "🚩", discord.ButtonStyle.secondary, report),
    "delete": ("Delete", "🗑️", discord.ButtonStyle.danger, delete),
}


CLIP_ACTIONS = ("report", "delete")  # only under a post that carries its clip
TEMPLATE = r"ag:turn:(?P<job>[0-9]+):(?P<action>" + "|".join(ACTIONS) + ")"


class TurnButton(discord.ui.DynamicItem[discord.ui.Button], template=TEMPLATE):
    """One of the buttons under a posted turn; everything it needs is in its custom id."""

    def __init__(self, job_id: int, action: str) -> None:
        label, emoji, style, _ = ACTIONS[action]
        super().__init__(
            discord.ui.Button(label=label, emoji=emoji, style=style, custom_id=f"ag:turn:{job_id}:{action}")
        )
        self.job_id, self.action = job_id, action

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: Any, match: re.Match[str]) -> TurnButton:
        return cls(int(match["job"]), match["action"])

    async def callback(self, interaction: discord.Interaction) -> None:
        try:
            await ACTIONS[self.action][3](interaction, self.job_id)
        except Exception as exc:
            await refuse_or_raise(interaction, exc)


def result_view(job_id: int, *, clip: bool = True) -> discord.ui.View:
    """The buttons under a posted turn; Report and Delete only where its clip was posted."""
    view = discord.ui.View(timeout=None)
    for action in ACTIONS:
        if clip or action not in CLIP_ACTIONS:
            view.add_item(TurnButton(job_id, action))
    return view


CONTINUE_FORM = re.compile(r"ag:continue:(?P<job>[0-9]+)")
INSTRUCTION_FIELD = "instruction"


class ContinueModal(discord.ui.Modal, title="Next turn"):
    """The form only; ``submit_continue`` answers its submissions.

    discord.py forgets a modal once it is submitted or the bot restarts, and then drops any later
    submission unanswered. Routing every submission by custom id instead means a form sent twice
    gets the same clear answer as any second turn, and a form opened before a restart still works.
    """

    instruction: discord.ui.TextInput = discord.ui.TextInput(
        label="Instruction", custom_id=INSTRUCTION_FIELD, style=discord.TextStyle.paragraph, max_length=200
    )

    def __init__(self, job_id: int, previous: str) -> None:
        super().__init__(custom_id=f"ag:continue:{job_id}", timeout=None)
        self.instruction.default = previous
        self.stop()  # nothing is kept in memory: see the class docstring


async def submit_continue(interaction: discord.Interaction) -> bool:
    """Answer a Continue form; False if the interaction is not one."""
    data = interaction.data or {}
    match = CONTINUE_FORM.fullmatch(str(data.get("custom_id", "")))
    if interaction.type is not discord.InteractionType.modal_submit or match is None:
        return False
    values = {
        c.get("custom_id"): c.get("value", "") for row in data.get("components", []) for c in row.get("components", [])
    }
    bot: AnimeGamerBot = interaction.client
    try:
        _, turn = await _job_for(interaction, int(match["job"]), owner_only=True)
        story = await _story_of(bot, turn)
        await submit_turn(bot, interaction, TurnInput(instruction=values.get(INSTRUCTION_FIELD, "")), story=story)
    except Exception as exc:
        await refuse_or_raise(interaction, exc)
    return True
