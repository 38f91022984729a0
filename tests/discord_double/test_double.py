"""The double is only worth trusting if the unmodified discord.py client works against it, so each test drives
the real client through one behaviour the bot relies on."""

from __future__ import annotations

import asyncio
import io
import itertools
import math
import re
import time
from collections.abc import Awaitable, Callable

import discord
from discord import app_commands
from discord.ext import commands

from tests.discord_double import (
    ATTACH_FILES,
    CALLBACK_PATH,
    DEFAULT_PERMISSIONS,
    EMBED_LINKS,
    READ_MESSAGE_HISTORY,
    SEND_MESSAGES,
    SEND_MESSAGES_IN_THREADS,
    WEBHOOK_PATH,
    Channel,
    DiscordDouble,
    Guild,
    Recorded,
    member,
    shard_for,
    thread,
)


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


async def eventually(predicate: Callable[[], object], timeout: float = 2.0) -> None:
    """For what the client does with a gateway event: nothing tells the double when it is done."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the client never got there"
        await asyncio.sleep(0.01)


def gaps(calls: list[Recorded]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(calls)]


# -- deadlines ---------------------------------------------------------------------------------------------


async def test_strict_mode_answers_a_late_callback_unknown_interaction(bot: commands.Bot) -> None:
    refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def slow(interaction: discord.Interaction) -> None:
        """Think too long."""
        await asyncio.sleep(0.5)
        try:
            await interaction.response.send_message("too late")
        except discord.NotFound as exc:
            refused.set_result(exc.code)

    async with DiscordDouble(strict=True, interaction_deadline=0.3) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("slow")
        assert await asyncio.wait_for(refused, 5) == 10062
        assert (await handle.response()).status == 404 and not double.messages()
        assert handle.late and handle.first_callback_seconds >= 0.5
        assert double.late_interactions() == [handle]


async def test_lenient_mode_accepts_a_late_callback_but_marks_it_late(bot: commands.Bot) -> None:
    @bot.tree.command()
    async def slow(interaction: discord.Interaction) -> None:
        """Think too long."""
        await asyncio.sleep(0.5)
        await interaction.response.send_message("late but shown")

    async with DiscordDouble(interaction_deadline=0.3) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("slow")
        assert (await handle.response()).status == 200 and handle.original.content == "late but shown"
        assert handle.late and double.late_interactions() == [handle]


async def test_a_prompt_callback_is_not_late(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def quick(interaction: discord.Interaction) -> None:
        """Answer at once."""
        await interaction.response.send_message("here")

    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("quick")
        await handle.response()
        assert handle.first_callback_seconds > 0 and not handle.late and double.late_interactions() == []


async def test_an_unanswered_interaction_is_late_only_once_the_deadline_passed(bot: commands.Bot) -> None:
    @bot.tree.command()
    async def ignore(interaction: discord.Interaction) -> None:
        """Never answer."""

    # A deadline of a second: the first look comes right after the slash, even on a busy machine.
    async with DiscordDouble(interaction_deadline=1.0) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("ignore")
        assert double.late_interactions() == []
        await asyncio.sleep(1.05)
        assert double.late_interactions() == [handle] and handle.first_callback_seconds is None


async def test_followups_after_the_token_lifetime_get_unknown_webhook(bot: commands.Bot) -> None:
    refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def render(interaction: discord.Interaction) -> None:
        """Render for longer than the token lives."""
        await interaction.response.defer(thinking=True)
        await asyncio.sleep(0.6)
        try:
            await interaction.followup.send("done")
        except discord.NotFound as exc:
            refused.set_result(exc.code)

    async with DiscordDouble(token_lifetime=0.5) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("render")
        assert await asyncio.wait_for(refused, 5) == 10015
        assert [c.status for c in await handle.followups()] == [404]


async def test_strict_mode_refuses_followups_to_an_unacknowledged_interaction(bot: commands.Bot) -> None:
    refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def skip(interaction: discord.Interaction) -> None:
        """Follow up without answering first."""
        try:
            await interaction.followup.send("hello?")
        except discord.NotFound as exc:
            refused.set_result(exc.code)

    async with DiscordDouble(strict=True) as double, double.running(bot):
        await bot.tree.sync()
        await double.slash("skip")
        assert await asyncio.wait_for(refused, 5) == 10015 and not double.messages()


async def test_followups_keep_coming_after_the_ephemeral_original_is_deleted(bot: commands.Bot) -> None:
    @bot.tree.command()
    async def secret(interaction: discord.Interaction) -> None:
        """Whisper twice."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.delete_original_response()
        await interaction.followup.send("only you", ephemeral=True)

    async with DiscordDouble(strict=True) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("secret")
        (followup,) = await handle.followups()
        assert followup.status == 200 and handle.original.deleted
        (message,) = double.messages()
        assert message.content == "only you" and message.ephemeral and message is not handle.original


# -- faults ------------------------------------------------------------------------------------------------


async def test_callback_succeeds_after_two_server_errors_with_backoff(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def greet(interaction: discord.Interaction) -> None:
        """Say hi."""
        await interaction.response.send_message("hi")

    fault = double.fail("POST", CALLBACK_PATH, times=2)
    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("greet")
        await double.wait_until(lambda: handle.original, 10.0, "the third try")
        attempts = double.calls_to("POST", CALLBACK_PATH)
        # discord.py's webhook adapter retries any 5xx, sleeping 1 + 2 * attempt seconds: 1 s, then 3 s.
        assert [c.status for c in attempts] == [500, 500, 200] and fault.hits == 2
        first, second = gaps(attempts)
        assert 1.0 <= first < second and second >= 3.0  # lower bounds only: a busy machine only adds time
        # Lateness is the first try's: the bot answered in time, the errors were Discord's.
        assert not handle.late and handle.responded


async def test_two_server_errors_on_the_callback_lose_the_reply_in_strict_mode(bot: commands.Bot) -> None:
    lost: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def greet(interaction: discord.Interaction) -> None:
        """Say hi."""
        try:
            await interaction.response.send_message("hi")
        except discord.NotFound as exc:
            lost.set_result(exc.code)

    async with DiscordDouble(strict=True) as double, double.running(bot):
        double.fail("POST", CALLBACK_PATH, times=2)
        await bot.tree.sync()
        handle = await double.slash("greet")
        assert await asyncio.wait_for(lost, 10) == 10062
        assert [c.status for c in double.calls_to("POST", CALLBACK_PATH)] == [500, 500, 404]
        assert not double.messages() and not handle.responded


async def test_rate_limited_callback_is_retried_after_retry_after(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def greet(interaction: discord.Interaction) -> None:
        """Say hi."""
        await interaction.response.send_message("hi")

    double.fail("POST", CALLBACK_PATH, status=429, retry_after=0.4)
    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("greet")
        await double.wait_until(lambda: handle.original, 5.0, "the retry")
        attempts = double.calls_to("POST", CALLBACK_PATH)
        assert [c.status for c in attempts] == [429, 200] and 0.4 <= gaps(attempts)[0] < 1.2


async def test_rate_limited_channel_post_is_retried_once(double: DiscordDouble, bot: commands.Bot) -> None:
    route = rf"/channels/{double.guild.channel.id}/messages"
    double.fail("POST", route, status=429, retry_after=0.3)
    async with double.running(bot):
        sent = await bot.get_partial_messageable(double.guild.channel.id).send("turn 1")
        attempts = double.calls_to("POST", route)
        assert [c.status for c in attempts] == [429, 200] and gaps(attempts)[0] >= 0.3
        assert [m.id for m in double.messages()] == [sent.id]


async def test_rate_limited_edit_of_the_original_is_retried(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def render(interaction: discord.Interaction) -> None:
        """Render a clip."""
        await interaction.response.defer(thinking=True)
        await interaction.edit_original_response(content="done")

    double.fail("PATCH", WEBHOOK_PATH, status=429, retry_after=0.2)
    async with double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("render")
        await double.wait_until(lambda: len(double.calls_to("PATCH", WEBHOOK_PATH)) == 2, 5.0, "the retry")
        assert [c.status for c in double.calls_to("PATCH", WEBHOOK_PATH)] == [429, 200]
        assert handle.original.content == "done"


async def test_fault_without_a_count_holds_until_cleared(double: DiscordDouble, bot: commands.Bot) -> None:
    route = rf"/channels/{double.guild.channel.id}/messages"
    fault = double.fail("POST", route, status=503, times=None)
    async with double.running(bot):
        channel = bot.get_partial_messageable(double.guild.channel.id)
        for _ in range(2):
            try:
                await channel.send("turn 1")  # the bot client retries 500, 502, 504 and 524, not 503
            except discord.DiscordServerError as exc:
                assert exc.status == 503
            else:
                raise AssertionError("the post should have failed")
        fault.clear()
        await channel.send("turn 1")
        assert fault.hits == 2 and [c.status for c in double.calls_to("POST", route)] == [503, 503, 200]


async def test_fault_answers_with_the_given_discord_error(double: DiscordDouble, bot: commands.Bot) -> None:
    route = rf"/channels/{double.guild.channel.id}/messages"
    double.fail("POST", route, status=403, code=50013, message="Missing Permissions")
    async with double.running(bot):
        try:
            await bot.get_partial_messageable(double.guild.channel.id).send("turn 1")
        except discord.Forbidden as exc:
            assert (exc.code, exc.text) == (50013, "Missing Permissions")
        else:
            raise AssertionError("the post should have been refused")
        assert not double.messages()


async def test_delay_without_status_answers_slowly_but_normally(double: DiscordDouble, bot: commands.Bot) -> None:
    route = rf"/channels/{double.guild.channel.id}/messages"
    double.fail("POST", route, status=0, delay=0.3)
    async with double.running(bot):
        started = time.monotonic()
        sent = await bot.get_partial_messageable(double.guild.channel.id).send("turn 1")
        assert time.monotonic() - started >= 0.3
        assert [m.id for m in double.messages()] == [sent.id] and double.calls_to("POST", route)[0].status == 200


# -- channels that refuse ----------------------------------------------------------------------------------


def guild_with(*channels: Channel) -> Guild:
    return Guild(channels=[Channel("general"), *channels])


async def expect_refusal(send: Awaitable[object], status: int, code: int) -> None:
    try:
        await send
    except discord.HTTPException as exc:
        assert (exc.status, exc.code) == (status, code)
    else:
        raise AssertionError(f"expected {status} {code}")


async def test_channel_without_send_messages_refuses_posts_but_not_replies(bot: commands.Bot) -> None:
    quiet = Channel("quiet", bot_permissions=DEFAULT_PERMISSIONS & ~SEND_MESSAGES)
    seen: asyncio.Future[tuple[bool, bool]] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def post(interaction: discord.Interaction) -> None:
        """Answer, then post in the channel."""
        await interaction.response.send_message("answered")  # interaction answers need no channel permission
        await expect_refusal(interaction.channel.send("posted"), 403, 50013)
        cached = interaction.channel.permissions_for(interaction.guild.me)
        seen.set_result((interaction.app_permissions.send_messages, cached.send_messages))

    async with DiscordDouble([guild_with(quiet)]) as double, double.running(bot):
        await bot.tree.sync()
        await double.slash("post", channel_id=quiet.id)
        assert await asyncio.wait_for(seen, 5) == (False, False)
        assert [m.content for m in double.messages(quiet.id)] == ["answered"]


async def test_files_need_attach_files(bot: commands.Bot) -> None:
    no_files = Channel("no-files", bot_permissions=DEFAULT_PERMISSIONS & ~ATTACH_FILES)
    async with DiscordDouble([guild_with(no_files)]) as double, double.running(bot):
        channel = bot.get_channel(no_files.id)
        clip = discord.File(io.BytesIO(b"frames"), "clip.mp4")
        await expect_refusal(channel.send("turn 1", file=clip), 403, 50013)
        await channel.send("turn 1, no clip")
        assert [m.content for m in double.messages(no_files.id)] == ["turn 1, no clip"]


async def test_replies_need_read_message_history(bot: commands.Bot) -> None:
    no_history = Channel("no-history", bot_permissions=DEFAULT_PERMISSIONS & ~READ_MESSAGE_HISTORY)
    async with DiscordDouble([guild_with(no_history)]) as double, double.running(bot):
        channel = bot.get_channel(no_history.id)
        first = await channel.send("turn 1")
        await expect_refusal(first.reply("turn 2"), 403, 50013)
        assert [m.content for m in double.messages(no_history.id)] == ["turn 1"]


async def test_embeds_are_dropped_silently_without_embed_links(bot: commands.Bot) -> None:
    plain = Channel("plain", bot_permissions=DEFAULT_PERMISSIONS & ~EMBED_LINKS)
    async with DiscordDouble([guild_with(plain)]) as double, double.running(bot):
        sent = await bot.get_channel(plain.id).send("turn 1", embed=discord.Embed(title="Scene"))
        assert sent.embeds == [] and double.message(sent.id).embeds == []
        assert double.calls_to("POST", rf"/channels/{plain.id}/messages")[0].json["embeds"][0]["title"] == "Scene"


async def test_thread_is_known_from_guild_create_and_takes_posts_until_archived(bot: commands.Bot) -> None:
    quest = thread("quest")
    guild = guild_with(quest)
    async with DiscordDouble([guild]) as double, double.running(bot):
        found = bot.get_channel(quest.id)
        assert isinstance(found, discord.Thread) and found.parent_id == guild.channel.id and not found.archived
        await found.send("turn 1")
        await double.archive(quest)
        await eventually(lambda: bot.get_channel(quest.id) is None)  # discord.py forgets archived threads
        await expect_refusal(found.send("turn 2"), 400, 50083)
        assert [m.content for m in double.messages(quest.id)] == ["turn 1"]


async def test_locked_thread_refuses_posts(bot: commands.Bot) -> None:
    quest = thread("quest", locked=True)
    async with DiscordDouble([guild_with(quest)]) as double, double.running(bot):
        await expect_refusal(bot.get_channel(quest.id).send("turn 1"), 400, 50083)
        assert not double.messages(quest.id)


async def test_threads_need_send_messages_in_threads_from_their_parent(bot: commands.Bot) -> None:
    parent = Channel("story", bot_permissions=DEFAULT_PERMISSIONS & ~SEND_MESSAGES_IN_THREADS)
    quest = thread("quest", parent)
    async with DiscordDouble([guild_with(parent, quest)]) as double, double.running(bot):
        await bot.get_channel(parent.id).send("chapter 1")
        await expect_refusal(bot.get_channel(quest.id).send("turn 1"), 403, 50013)
        assert double.bot_permissions_in(quest) == parent.bot_permissions


async def test_interaction_in_a_thread_reaches_the_bot_as_a_thread(bot: commands.Bot) -> None:
    where: asyncio.Future[discord.abc.Messageable] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def here(interaction: discord.Interaction) -> None:
        """Where am I?"""
        where.set_result(interaction.channel)
        await interaction.response.send_message("in the thread")

    quest = thread("quest")
    async with DiscordDouble([guild_with(quest)]) as double, double.running(bot):
        await bot.tree.sync()
        handle = await double.slash("here", channel_id=quest.id)
        channel = await asyncio.wait_for(where, 5)
        assert isinstance(channel, discord.Thread) and channel.id == quest.id
        assert (await handle.response()).status == 200 and double.messages(quest.id)[0].content == "in the thread"


async def test_deleted_channel_is_unknown_to_both_sides(bot: commands.Bot) -> None:
    doomed = Channel("doomed")
    async with DiscordDouble([guild_with(doomed)]) as double, double.running(bot):
        channel = bot.get_channel(doomed.id)
        await double.delete_channel(doomed)
        await eventually(lambda: bot.get_channel(doomed.id) is None)
        await expect_refusal(channel.send("turn 1"), 404, 10003)


# -- DMs ---------------------------------------------------------------------------------------------------


async def test_dm_to_the_player_is_stored_under_their_id(double: DiscordDouble, bot: commands.Bot) -> None:
    @bot.tree.command()
    async def remind(interaction: discord.Interaction) -> None:
        """DM me."""
        await interaction.user.send("your clip is ready")
        await interaction.response.send_message("sent you a DM", ephemeral=True)

    async with double.running(bot):
        await bot.tree.sync()
        await (await double.slash("remind")).response()
        (dm,) = double.dms(double.player)
        assert dm.content == "your clip is ready" and dm.guild_id is None
        assert double.calls_to("POST", "/users/@me/channels")[0].json == {"recipient_id": double.player.id}


async def test_dm_to_a_user_with_closed_dms_is_forbidden(double: DiscordDouble, bot: commands.Bot) -> None:
    refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @bot.tree.command()
    async def remind(interaction: discord.Interaction) -> None:
        """DM me."""
        try:
            await interaction.user.send("your clip is ready")
        except discord.Forbidden as exc:
            refused.set_result(exc.code)
        await interaction.response.send_message("could not DM you", ephemeral=True)

    async with double.running(bot):
        await bot.tree.sync()
        shy = member("shy", dms_open=False)
        await double.slash("remind", user=shy)
        assert await asyncio.wait_for(refused, 5) == 50007
        assert double.dms(shy) == []
