"""The bot process: one AutoShardedBot that owns the game database and watches the queue.

``setup_hook`` does the one-time work (migrate, load cogs, register the persistent buttons,
sync commands if they changed, start the delivery loop); ``on_ready`` only logs, since it fires
again after reconnects. The bot never imports torch: turns go to the workers by task name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aiohttp
import discord
import yarl
from celery import Celery
from discord import app_commands
from discord.ext import commands
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.buttons import TurnButton
from bot.clip_store import ClipStore, FolderStore
from bot.delivery import Delivery
from bot.errors import on_app_command_error
from bot.health import readiness
from bot.leases import LeaseHold, PostingShards, process_name
from bot.liveness import Liveness, RestWatch
from bot.metrics import BotMetrics
from bot.notices import Notices
from bot.outbox import Outbox
from bot.presence import WorkerPresence
from bot.queue import TurnQueue
from bot.retention import Retention
from bot.rounds import Rounds
from bot.suggestions import Suggestions
from bot.supervisor import Supervisor, limits_from
from bot.sync import sync_if_changed
from bot.votes import VoteButton
from bot.watchdog import LoopWatch
from db.engine import make_engine, make_sessionmaker
from db.leases import live_holders
from db.migrate import ready_schema
from db.queries import game_id, result_secret
from relay.blob_store import store_for
from relay.celery_app import make_celery
from relay.settings import Settings

log = logging.getLogger(__name__)

EXTENSIONS = ("bot.cogs.play", "bot.cogs.story", "bot.cogs.admin", "bot.cogs.community", "bot.cogs.mydata")
RESTARTING = "The bot is restarting; try again in a minute."


def point_at(api_base: str, gateway_url: str) -> None:
    """Send REST and gateway traffic through proxies (or the tests' loopback double)."""
    if api_base:
        discord.http.Route.BASE = api_base.rstrip("/")
    if gateway_url:
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


def bound_discord_calls(http: discord.http.HTTPClient, seconds: float) -> None:
    """Give every request of discord.py's session (REST, interaction callbacks, webhooks) a time limit of ``seconds``
    instead of aiohttp's 300 s, so that a duty's round waiting on Discord ends within its hold and the call's failure
    is retried by the duty's next holder. discord.py takes no timeout, so it is set on the session it made at login;
    the gateway's websocket keeps its own (aiohttp drops the read limit of an upgraded connection)."""
    session = getattr(http, "_HTTPClient__session", None)
    if isinstance(session, aiohttp.ClientSession):
        session._timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=seconds)
    else:
        log.warning("discord.py's session was not found; Discord calls keep aiohttp's 300 s limit")


class Tree(app_commands.CommandTree["AnimeGamerBot"]):
    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        """A bot that is stopping takes no new command: the player hears why instead of "interaction failed"."""
        if not self.client.stopping:
            return True
        if interaction.type is discord.InteractionType.application_command:
            await interaction.response.send_message(RESTARTING, ephemeral=True)
        return False


class AnimeGamerBot(commands.AutoShardedBot):
    user: discord.ClientUser
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    def __init__(self, settings: Settings, celery_app: Celery | None = None) -> None:
        self.metrics = BotMetrics()
        self.rest_watch = RestWatch(quiet=settings.duty_seconds)
        http_trace = self.metrics.http_trace()  # times each interaction's first answer
        self.rest_watch.hook(http_trace)  # and how long Discord's REST has left this process unanswered
        super().__init__(
            command_prefix=commands.when_mentioned,
            intents=discord.Intents.default(),
            shard_count=settings.shard_count,
            shard_ids=settings.shard_ids,  # None: every shard
            # Nothing the bot echoes pings anyone unless a message asks for it explicitly.
            allowed_mentions=discord.AllowedMentions.none(),
            http_trace=http_trace,
            tree_cls=Tree,
        )
        self.stopping = False  # set on SIGTERM (animegamer.cli.bot): new commands are told to come back
        if celery_app is None:
            celery_app = make_celery(settings)
        self.settings = settings
        self.queue = TurnQueue(celery_app, settings.broker_timeout)
        self.clips = ClipStore.of(settings)
        self.process = process_name()  # this process, as the leases it holds name it
        self.disconnected: dict[int, float] = {}  # shard id -> time.monotonic() when it lost its gateway
        self.connected_once: set[int] = set()  # shards that reached their gateway since the process started
        self.started_at = time.monotonic()
        self.limits = limits_from(settings)
        self.blobs = store_for(settings)  # past turns' representations go out, clips come back, through it
        self.presence = WorkerPresence(settings, self.queue)
        self.metrics.watch(self)
        self.notices = Notices(settings, self.open_session, self)
        self.outbox = Outbox(
            settings,
            self.open_session,
            self.queue,
            self.blobs,
            self.presence,
            self.limits,
            LeaseHold(self.open_session, "outbox", self.process, settings.duty_seconds, self.working),
        )
        self.posting = PostingShards(
            self.open_session, self.process, settings.duty_seconds, self.connected_shards, self.working
        )
        self.delivery = Delivery(
            settings, self.open_session, self.clips, self.metrics, self.notices, self.posting, self
        )
        self.supervisor = Supervisor(
            settings,
            self.open_session,
            self.queue,
            self.clips,
            self.metrics,
            self.outbox,
            self.presence,
            self.notices,
            self.delivery,
        )
        self.loop_watch = LoopWatch()
        self.retention = Retention(settings, self.open_session, self.clips, self.blobs, self.queue, self.process, self)
        self.suggestions = Suggestions(settings, self.open_session)
        # SQLite has one writer at a time: turn submissions queue here, where waiting costs nothing and
        # has no deadline, instead of in SQLite's busy handler, which gives up after db_busy_timeout.
        sqlite = settings.database_url.startswith("sqlite")
        self.submitting: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Lock() if sqlite else contextlib.nullcontext()
        )
        self.rounds = Rounds(settings, self.open_session, self.outbox, self.submitting, self)
        self.liveness = Liveness(
            lambda: self.loop_watch.beat_at,
            {"supervisor": self.supervisor, "vote rounds": self.rounds},
            self.rest_watch,
        )
        point_at(settings.discord_api_base, settings.discord_gateway_url)

    def working(self, deadline: float) -> str | None:
        """None while this process works; else why not (stuck for ``deadline``): its duties' holds ask it."""
        return self.liveness.working(deadline)

    def open_session(self) -> AsyncSession:
        """A session of the game database, for the duties made before ``setup_hook`` makes the sessionmaker."""
        return self.sessions()

    async def setup_hook(self) -> None:
        bound_discord_calls(self.http, self.settings.discord_timeout)
        self.metrics.serve(
            self.settings.metrics_port,
            self.settings.metrics_address,
            lambda: readiness(self),
            lambda: self.liveness.report(self.settings.liveness_seconds),
        )
        self.loop_watch.start()
        self.liveness.start(blocked_after=self.settings.liveness_seconds / 2)
        await ready_schema(self.settings.database_url, self.settings.migrate_at_start)
        self.engine = make_engine(
            self.settings.database_url,
            busy_timeout=self.settings.db_busy_timeout,
            call_timeout=self.settings.duty_seconds / 2,  # no round of a duty waits on it longer than half its hold
        )
        self.sessions = make_sessionmaker(self.engine)
        async with self.sessions() as session, session.begin():
            self.clips.game = await game_id(session)  # every key this process makes starts with it
            self.outbox.result_secret = await result_secret(session)  # what each turn's ticket is made with
        if isinstance(self.clips, FolderStore):  # every process of a game must see one folder, or clips go missing
            await self._check_clip_folder(self.clips)
        self.tree.on_error = on_app_command_error
        for extension in EXTENSIONS:
            await self.load_extension(extension)
        self.add_dynamic_items(TurnButton, VoteButton)
        await sync_if_changed(self)
        await self.presence.refresh()  # before the first command: which characters workers play
        with contextlib.suppress(Exception):  # so the first command's turn is sent at once where this process sends
            await self.outbox.lease.renew()
        self.supervisor.start()
        self.delivery.start()
        self.retention.start()
        self.rounds.start()

    async def _check_clip_folder(self, clips: FolderStore) -> None:
        """Refuse to start (``UnsharedClips``) beside a live process of this game that keeps its clips in another
        folder. A holder that left no mark here is asked again after one lease: one whose rows came with a restored
        backup, or that just died, has lapsed by then; a live one has renewed."""
        await asyncio.to_thread(clips.mark, self.process)
        apart = clips.apart(await self._live_processes())
        if apart:
            await asyncio.sleep(self.settings.duty_seconds)
            apart &= await self._live_processes()
        if apart:
            raise clips.refuse(apart)

    async def _live_processes(self) -> set[str]:
        async with self.sessions() as session:
            return await live_holders(session) - {self.process}

    def dispatch(self, event_name: str, /, *args: Any, **kwargs: Any) -> None:
        # Called as the gateway hands an interaction over, before any handler of it can run.
        if event_name == "interaction":
            self.metrics.received(args[0])
        super().dispatch(event_name, *args, **kwargs)

    # Readiness (bot/health.py): when each shard lost its gateway, cleared once it is connected again. discord.py's
    # is_ready() stays true while every shard reconnects; this is what says the bot is not reaching Discord.
    async def on_shard_disconnect(self, shard_id: int) -> None:
        self.disconnected.setdefault(shard_id, time.monotonic())

    async def on_shard_connect(self, shard_id: int) -> None:
        self.disconnected.pop(shard_id, None)
        self.connected_once.add(shard_id)

    on_shard_resumed = on_shard_ready = on_shard_connect

    def connected_shards(self) -> tuple[int, list[int]] | None:
        """How many shards the bot has and which this process connects; None until it knows (at login)."""
        if not self.shard_count:
            return None
        return self.shard_count, list(self.shard_ids) if self.shard_ids is not None else list(range(self.shard_count))

    async def on_ready(self) -> None:
        with contextlib.suppress(Exception):  # the first posts need not wait for the leases' next renewal
            await self.posting.renew()
        shards = self.shard_ids if self.shard_ids is not None else "all"
        log.info(
            "ready as %s in %d guilds (shards %s of %d)", self.user, len(self.guilds), shards, self.shard_count or 1
        )

    def served_characters(self) -> list[str] | None:
        """The characters some running worker plays, or None when any name is served (one model for all)."""
        return self.presence.served

    async def close(self) -> None:
        await self.retention.stop()
        await self.rounds.stop()
        await self.supervisor.stop()
        await self.delivery.stop()
        await self.loop_watch.stop()
        self.liveness.stop()
        await super().close()
        self.queue.close()
        if hasattr(self, "engine"):
            await self.engine.dispose()
        if isinstance(self.clips, FolderStore):
            self.clips.unmark(self.process)
        await asyncio.to_thread(self.metrics.close)  # waits out the server's poll
