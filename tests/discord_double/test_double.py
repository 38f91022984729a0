"""The double is only worth trusting if the unmodified discord.py client works against it, so each test drives
the real client through one behaviour the bot relies on."""

from __future__ import annotations

import asyncio
import io
import math
import re

import discord
from discord import app_commands
from discord.ext import commands

from tests.discord_double import DiscordDouble, Guild, member, shard_for


async def test_bot_logs_in_receives_guilds_and_heartbeat_acks() -> None:
    intents = discord.Intents.default()
    intents.members = True  # makes the client ask for member chunks, which the double must answer
    bot = commands.Bot(command_prefix="!", intents=intents)
    async with DiscordDouble(heartbeat_interval_ms=100) as double, double.running(bot):
        guild = bot.get_guild(double.guild.id)
        assert guild is not None and guild.name == double.guild.name
        assert guild.chunked and guild.owner_id == double.guild.owner.id
        assert guild.me.id == double.bot.id == bot.user.id
        assert bot.get_channel(double.guild.channel.id) is not None
        await double.wait_until(lambda: double.heartbeats >= 3, 5.0, "three heartbeats")
        assert math.isfinite(bot.latency)
        assert double.calls_to("GET", "/users/@me") and double.calls_to("GET", "/oauth2/applications/@me")


async def test_tree_sync_reaches_the_double_and_keeps_ids(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def act(interaction: discord.Interaction, instruction: str) -> None:
        """Tell your character what to do."""

    async with double.running(bot):
        synced = await bot.tree.sync()
        await double.wait_for("PUT", rf"/applications/{double.application_id}/commands")
        assert [c.name for c in synced] == ["act"] and double.sync_count == 1
        assert double.commands[None][0]["options"][0]["name"] == "instruction"
        again = await bot.tree.sync(guild=discord.Object(double.guild.id))
        assert again == [] and double.commands[double.guild.id] == []
        assert (await bot.tree.sync())[0].id == synced[0].id


async def test_slash_command_answer_arrives_as_type_4(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def greet(interaction: discord.Interaction, times: int) -> None:
        """Say hi."""
        await interaction.response.send_message("hi" * times)

    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("greet", {"times": 1})
        callback = await handle.response()
        assert callback.json == {"type": 4, "data": callback.json["data"]} and callback.json["data"]["content"] == "hi"
        assert handle.payload["data"]["options"] == [{"name": "times", "type": 4, "value": 1}]
        assert [m.content for m in double.messages(double.guild.channel.id)] == ["hi"]


async def test_grouped_subcommand_gets_typed_and_resolved_options(double: DiscordDouble, bot: commands.Bot) -> None:
    got: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

    class Story(app_commands.Group):
        """Play a story."""

        @app_commands.command()
        async def start(self, interaction: discord.Interaction, rival: discord.Member, turns: int) -> None:
            """Start a story against a rival."""
            got.set_result((rival.id, turns))
            await interaction.response.send_message("started")

    bot.tree.add_command(Story())
    rival = member("rival")
    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("story start", {"rival": rival, "turns": 3})
        assert await asyncio.wait_for(got, 5) == (rival.id, 3)
        (sub,) = handle.payload["data"]["options"]
        assert sub["type"] == 1 and [o["type"] for o in sub["options"]] == [6, 4]


async def test_deferred_followup_carries_the_file(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def render(interaction: discord.Interaction) -> None:
        """Render a clip."""
        await interaction.response.defer(thinking=True)
        await interaction.followup.send("done", file=discord.File(io.BytesIO(b"\x00mp4 bytes"), "clip.mp4"))

    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("render")
        assert (await handle.response()).json["type"] == 5
        (followup,) = await handle.followups()
        assert followup.files[0].filename == "clip.mp4" and followup.files[0].data == b"\x00mp4 bytes"
        # The first followup replaces the "thinking" message instead of adding one.
        (message,) = double.messages(double.guild.channel.id)
        assert message is handle.original and message.content == "done"
        assert message.attachments[0]["filename"] == "clip.mp4" and not message.flags


async def test_channel_send_uploads_multipart(double: DiscordDouble, bot: commands.Bot) -> None:
    async with double.running(bot):
        channel = bot.get_channel(double.guild.channel.id)
        assert isinstance(channel, discord.TextChannel)
        sent = await channel.send("turn 1", file=discord.File(io.BytesIO(b"frames"), "clip.mp4"))
        call = await double.wait_for("POST", rf"/channels/{channel.id}/messages")
        assert call.json["content"] == "turn 1" and call.files[0].data == b"frames"
        assert call.headers["Content-Type"].startswith("multipart/form-data")
        (stored,) = double.messages(channel.id)
        assert stored.id == sent.id and stored.attachments[0]["content_type"] == "video/mp4"
        assert sent.attachments[0].size == 6 and await sent.attachments[0].read() == b"frames"


class Retry(discord.ui.DynamicItem[discord.ui.Button], template=r"ag:turn:(?P<job_id>\d+):retry"):
    clicked: asyncio.Future[int]

    def __init__(self, job_id: int) -> None:
        super().__init__(discord.ui.Button(label="Retry", custom_id=f"ag:turn:{job_id}:retry"))
        self.job_id = job_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Button, match: re.Match[str]
    ) -> Retry:
        return cls(int(match["job_id"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        await interaction.response.edit_message(content=f"retrying {self.job_id}")
        Retry.clicked.set_result(self.job_id)


async def test_dynamic_button_survives_without_a_view(double: DiscordDouble, bot: commands.Bot) -> None:
    Retry.clicked = asyncio.get_running_loop().create_future()
    bot.add_dynamic_items(Retry)
    async with double.running(bot):
        channel = bot.get_channel(double.guild.channel.id)
        assert isinstance(channel, discord.TextChannel)
        view = discord.ui.View(timeout=None).add_item(Retry(42))
        sent = await channel.send("turn 42", view=view)
        view.stop()  # as after a restart: only the dynamic item's template remains
        handle = await double.button(sent.id, "ag:turn:42:retry", user=member("clicker"))
        assert await asyncio.wait_for(Retry.clicked, 5) == 42
        assert (await handle.response()).json["type"] == 7
        assert double.message(sent.id).content == "retrying 42"


async def test_modal_submit_reaches_on_submit(double: DiscordDouble, bot: commands.Bot) -> None:
    submitted: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    class Describe(discord.ui.Modal, title="Describe your character"):
        looks = discord.ui.TextInput(label="Looks", custom_id="looks", max_length=200)

        async def on_submit(self, interaction: discord.Interaction) -> None:
            await interaction.response.send_message("saved", ephemeral=True)
            submitted.set_result(self.looks.value)

    @bot.tree.command()
    async def describe(interaction: discord.Interaction) -> None:
        """Describe your character."""
        await interaction.response.send_modal(Describe(custom_id="ag:describe"))

    async with double.running(bot):
        await bot.tree.sync()
        opened = await (await double.slash("describe")).response()
        assert opened.json["type"] == 9 and "ag:describe" in double.modals
        handle = await double.modal_submit("ag:describe", {"looks": "silver hair"})
        assert await asyncio.wait_for(submitted, 5) == "silver hair"
        assert (await handle.response()).json["data"]["flags"] == 64


async def test_autocomplete_choices_come_back(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def pick(interaction: discord.Interaction, character: str) -> None:
        """Pick a character."""

    @pick.autocomplete("character")
    async def suggest(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        names = ["Kaito", "Kana", "Ren"]
        return [app_commands.Choice(name=n, value=n.lower()) for n in names if n.lower().startswith(current)]

    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.autocomplete("pick", "character", "ka")
        assert await handle.choices() == [{"name": "Kaito", "value": "kaito"}, {"name": "Kana", "value": "kana"}]


async def test_auto_sharded_bot_gets_each_guild_on_its_shard() -> None:
    guilds = [Guild("shard zero", id=1_000_000_000 << 22), Guild("shard one", id=1_000_000_001 << 22)]
    bot = commands.AutoShardedBot(command_prefix="!", intents=discord.Intents.default(), shard_count=2)

    @bot.tree.command()
    async def where(interaction: discord.Interaction) -> None:
        """Which shard am I on?"""
        await interaction.response.send_message(str(interaction.guild.shard_id))

    async with DiscordDouble(guilds) as double, double.running(bot):
        await bot.tree.sync()
        for guild in guilds:
            shard = shard_for(guild.id, 2)
            assert double.shards[shard].guild_ids == [guild.id]
            assert bot.get_guild(guild.id).shard_id == shard
            handle = await double.slash("where", guild_id=guild.id)
            assert (await handle.response()).json["data"]["content"] == str(shard)
        assert not double.calls_to("GET", "/gateway/bot")  # a fixed shard_count connects straight away


async def test_auto_sharded_bot_asks_for_recommended_shards() -> None:
    bot = commands.AutoShardedBot(command_prefix="!", intents=discord.Intents.default())
    async with DiscordDouble(shard_count=2) as double, double.running(bot):
        assert bot.shard_count == 2 and sorted(bot.shards) == [0, 1]
        assert double.calls_to("GET", "/gateway/bot")


async def test_member_permissions_reach_the_interaction(double: DiscordDouble, bot: commands.Bot) -> None:
    seen: list[bool] = []

    @bot.tree.command()
    async def settings(interaction: discord.Interaction) -> None:
        """Change server settings."""
        seen.append(interaction.permissions.manage_guild)
        await interaction.response.send_message("ok", ephemeral=True)

    async with double.running(bot):
        await bot.tree.sync()
        for user in (member("player"), member("mod", manage_guild=True), member("admin", administrator=True)):
            await (await double.slash("settings", user=user)).response()
        assert seen == [False, True, True]


async def test_client_resumes_after_reconnect_request(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def ping(interaction: discord.Interaction) -> None:
        """Still there?"""
        await interaction.response.send_message("pong")

    async with double.running(bot):
        await bot.tree.sync()
        await double.reconnect()
        assert double.shards[0].resumes == 1 and len(double.sessions) == 1
        handle = await double.slash("ping")
        assert (await handle.response()).json["data"]["content"] == "pong"


async def test_unknown_routes_are_recorded_as_404(double: DiscordDouble, bot: commands.Bot) -> None:
    async with double.running(bot):
        guild = bot.get_guild(double.guild.id)
        try:
            await guild.fetch_roles()
        except discord.NotFound as exc:
            assert "no route" in exc.text
        else:
            raise AssertionError("fetch_roles should have failed")
        assert double.calls_to("GET", rf"/guilds/{guild.id}/roles")[0].status == 404


async def test_exit_restores_discord_urls() -> None:
    before = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    async with DiscordDouble() as double:
        assert double.api_base == discord.http.Route.BASE
        discord.http.Route.BASE = "http://elsewhere"  # as the bot does from DISCORD_API_BASE
    assert before == (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)


async def test_a_repeated_nonce_returns_the_first_message_instead_of_a_second():
    async with DiscordDouble() as double:
        bot = commands.Bot(command_prefix="!", intents=discord.Intents.default())
        async with double.running(bot):
            channel = bot.get_partial_messageable(double.guild.channels[0].id)
            first = await channel.send("clip", nonce="agjob1")
            again = await channel.send("clip", nonce="agjob1")
    assert first.id == again.id
    assert len(double.messages(double.guild.channels[0].id)) == 1
