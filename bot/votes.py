"""A vote round's message: the proposals, their votes, a button for each, and the result once it closes.

The buttons are one ``DynamicItem`` with the round and the proposal in the custom id
(``ag:vote:<round>:<proposal>``), so a round's message keeps working across restarts; every vote re-reads the round
from the database, which refuses a vote once the round is closed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import discord

from bot.cards import plain
from bot.errors import Refusal, refuse_or_raise
from db import moderation
from db.rounds import Standing, cast_vote

if TYPE_CHECKING:
    from bot.app import AnimeGamerBot

LABEL_CHARS = 40  # a button's label: its number and the start of the motion


def round_text(standing: Standing, voters: list[int] | None = None) -> str:
    """The round as its message says it; with ``voters``, the closed round's result and who chose it."""
    story, found = standing.story, standing.round
    title = plain(story.title, 100)
    lines = [
        f"{number}. {plain(proposal.instruction, 200)} (<@{proposal.user_id}>): {votes} vote{'s' if votes != 1 else ''}"
        for number, (proposal, votes) in enumerate(standing.proposals, 1)
    ]
    if voters is None:
        closes = int(found.closes_at.timestamp())
        head = f"🗳️ **{title}**, round {found.number}: vote for the next turn; it closes <t:{closes}:R>."
        return "\n".join([head, *lines, "Propose another with /story propose."])
    chosen = standing.winner
    if chosen is None:
        return "\n".join([f"🗳️ **{title}**, round {found.number} closed with nothing to play.", *lines])
    by = ", ".join(f"<@{user}>" for user in voters) or "nobody (the first proposal wins an empty vote)"
    result = (
        f"🗳️ **{title}**, round {found.number} closed: **{plain(chosen.instruction, 200)}** wins, "
        f"proposed by <@{chosen.user_id}>, chosen by {by}."
    )
    return "\n".join([result, *lines])


def round_view(standing: Standing) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    for number, (proposal, _) in enumerate(standing.proposals, 1):
        motion = proposal.instruction.split("Motion:", 1)[-1].split(";", 1)[0].strip()
        view.add_item(VoteButton(standing.round.id, proposal.id, f"{number}. {motion}"[:LABEL_CHARS]))
    return view


class VoteButton(discord.ui.DynamicItem[discord.ui.Button], template=r"ag:vote:(?P<round>[0-9]+):(?P<proposal>[0-9]+)"):
    """A vote for one proposal of one round; a second click on another proposal changes the vote."""

    def __init__(self, round_id: int, proposal_id: int, label: str = "vote") -> None:
        button = discord.ui.Button(
            label=label, style=discord.ButtonStyle.primary, custom_id=f"ag:vote:{round_id}:{proposal_id}"
        )
        super().__init__(button)
        self.round_id, self.proposal_id = round_id, proposal_id

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: Any, match: re.Match[str]) -> VoteButton:
        return cls(int(match["round"]), int(match["proposal"]), getattr(item, "label", None) or "vote")

    async def callback(self, interaction: discord.Interaction) -> None:
        bot: AnimeGamerBot = interaction.client
        try:
            await interaction.response.defer(ephemeral=True, thinking=True)
            if not (0 < self.round_id < 2**31 and 0 < self.proposal_id < 2**31):  # a forged custom id
                raise Refusal("That vote is not part of any round.")
            guild_id, user_id = interaction.guild_id or 0, interaction.user.id
            async with bot.sessions() as session, session.begin():
                if await moderation.find_ban(session, guild_id, user_id) is not None:
                    raise Refusal("You are banned from the game on this server.")
                counted = await cast_vote(session, guild_id, self.round_id, self.proposal_id, user_id)
            if not counted:
                raise Refusal("This round is closed; its winner is being played.")
            changeable = "Your vote is in; you can change it until the round closes."
            await interaction.followup.send(changeable, ephemeral=True)
            bot.rounds.show(self.round_id)
        except Exception as exc:
            await refuse_or_raise(interaction, exc)
