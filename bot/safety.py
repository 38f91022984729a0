"""The server's safety policy, applied where a clip would be seen: a posted turn, a recap, a story page.

Each place asks ``ClipRules.of(settings, sessions, client, guild, channel)`` once (one read of the server's policy
and threshold, one look at whether the channel is age-restricted) and then judges every clip's stored detector
report with it, so a clip withheld from a turn's post cannot come back inside a recap, nor a flagged one posted in
an age-restricted channel reach another channel, or the same one after the server changed its policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import discord
from pydantic import ValidationError

from db import moderation
from game.safety import SafetyPolicy, SafetyReport, Verdict, judge, unchecked

if TYPE_CHECKING:
    from db.engine import Sessions
    from relay.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClipRules:
    policy: SafetyPolicy
    threshold: float
    age_restricted: bool

    @classmethod
    async def of(
        cls,
        settings: Settings,
        sessions: Sessions,
        client: discord.Client,
        guild_id: int | None,
        channel_id: int | None,
    ) -> ClipRules:
        async with sessions() as session:
            policy, threshold = await moderation.safety_of(session, guild_id)
        restricted = policy is SafetyPolicy.AGE_RESTRICTED and await age_restricted(client, channel_id)
        # A server's own threshold, held to the operator's cap (one stored before the cap was lowered included).
        return cls(policy, min(threshold or settings.safety_threshold, settings.safety_threshold_max), restricted)

    def judge(self, safety: str | None) -> Verdict:
        """A turn's stored report (JSON) under these rules; a report that cannot be read withholds the clip."""
        try:
            report = SafetyReport.model_validate_json(safety or "")
        except ValidationError:
            report = unchecked("the worker sent no safety report")
        return judge(report, self.threshold, self.policy, self.age_restricted)

    def shown_again(self, safety: str | None) -> bool:
        """Whether a stored clip may go into a recap or a story page here. A turn recorded before clips were checked
        (revision 0009: no report) was posted as it was and stays in them."""
        return safety is None or self.judge(safety).post


async def age_restricted(client: discord.Client, channel_id: int | None) -> bool:
    """Whether Discord marks the channel age-restricted (a thread: its parent), asked over REST when this process
    does not hold the channel's shard; unknown is False, so a flagged clip is withheld."""
    if channel_id is None:
        return False
    channel = client.get_channel(channel_id)
    try:
        if channel is None:
            channel = await client.fetch_channel(channel_id)
        if isinstance(channel, discord.Thread) and channel.parent is None:
            channel = await client.fetch_channel(channel.parent_id)
    except (discord.HTTPException, OSError) as exc:
        log.info("channel %s: age restriction unknown (%s); a flagged clip is withheld", channel_id, exc)
        return False
    is_nsfw = getattr(channel, "is_nsfw", None)
    return bool(is_nsfw()) if callable(is_nsfw) else False
