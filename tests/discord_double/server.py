"""A loopback Discord for tests: the real discord.py client logs in, connects and answers interactions here.

Discord cannot be reached from the build machines, and mocking discord.py would test our guesses about it
instead of the library. So this aiohttp app speaks just enough of the gateway and REST API for the client to
run unmodified, records every REST call, and remembers the messages the bot creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

import discord
import yarl
from aiohttp import WSMsgType, web

from .payloads import (
    ADMINISTRATOR,
    ALL_PERMISSIONS,
    ATTACH_FILES,
    DEFAULT_ATTACHMENT_SIZE_LIMIT,
    DEFAULT_PERMISSIONS,
    DM,
    EMBED_LINKS,
    LOADING,
    READ_MESSAGE_HISTORY,
    SEND_MESSAGES,
    SEND_MESSAGES_IN_THREADS,
    VIEW_CHANNEL,
    Channel,
    Guild,
    Member,
    StoredMessage,
    UploadedFile,
    User,
    command_options,
    component_row,
    interaction_payload,
    member,
    now_iso,
    shard_for,
    snowflake,
)

log = logging.getLogger(__name__)
ClientT = TypeVar("ClientT", bound=discord.Client)

API_PREFIX = "/api/v10"
HEARTBEAT_ACK_DELAY = 0.02  # seconds: a round trip to Discord's gateway
# For ``double.fail``: every interaction callback, and every followup / webhook message call.
CALLBACK_PATH = r"/interactions/\d+/[^/]+/callback"
WEBHOOK_PATH = r"/webhooks/\d+/[^/]+(?:/messages/(?:@original|\d+))?"


@dataclass
class Recorded:
    """One REST request; for multipart bodies ``json`` is the parsed ``payload_json`` part."""

    method: str
    path: str
    json: Any
    files: list[UploadedFile]
    headers: dict[str, str]
    query: dict[str, str]
    status: int = 0
    at: float = 0.0  # time.monotonic() when the request arrived


@dataclass
class Session:
    """One gateway session; it outlives its websocket so that RESUME can replay what was missed."""

    id: str
    shard_id: int
    shard_count: int
    identify: dict[str, Any]
    ws: web.WebSocketResponse | None
    seq: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    guild_ids: list[int] = field(default_factory=list)
    resumes: int = 0


@dataclass
class Fault:
    """What ``double.fail`` installed: the next ``times`` matching requests get this answer (None: all)."""

    method: str
    pattern: re.Pattern[str]
    status: int
    code: int
    message: str
    times: int | None
    delay: float
    retry_after: float | None
    host: str | None = None  # only requests that named this host (the Host header): one process of several
    hits: int = 0
    cleared: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set when cleared: held requests go on at once

    @property
    def active(self) -> bool:
        return not self.cleared and (self.times is None or self.hits < self.times)

    def takes(self, rec: Recorded) -> bool:
        if self.host is not None and rec.headers.get("Host", "").rsplit(":", 1)[0] != self.host:
            return False
        method = self.method in ("*", rec.method)
        return self.active and method and self.pattern.fullmatch(rec.path) is not None

    def clear(self) -> None:
        self.cleared = True
        self.released.set()

    def answer(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The body and headers; a 429 is Discord's, with the ``Via`` header discord.py needs to trust it."""
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(math.ceil(self.retry_after))
        if self.status == 429:
            headers.update({"X-RateLimit-Scope": "user", "Via": "1.1 google"})
            return {"message": self.message, "retry_after": self.retry_after, "global": False}, headers
        return {"message": self.message, "code": self.code}, headers


class ApiError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class InteractionHandle:
    """An interaction the double sent; the bot's answers to it are found through its token."""

    double: DiscordDouble
    id: int
    token: str
    type: int
    guild_id: int | None
    channel_id: int
    payload: dict[str, Any]
    original_id: int | None = None
    deferred: bool = False  # the first followup fills the "thinking" message, as Discord does
    responded: bool = False
    dispatched_at: float = 0.0  # time.monotonic() when INTERACTION_CREATE went out
    first_callback_seconds: float | None = None  # dispatch to the first callback's arrival, accepted or not

    @property
    def late(self) -> bool:
        """The first callback came after the deadline, or none came and the deadline has passed."""
        waited = self.first_callback_seconds
        if waited is None:
            waited = time.monotonic() - self.dispatched_at
        return waited > self.double.interaction_deadline

    async def response(self, timeout: float = 5.0) -> Recorded:
        """The interaction callback (type 4 message, 5 defer, 7 update, 8 choices, 9 modal, ...)."""
        path = rf"/interactions/{self.id}/{re.escape(self.token)}/callback"
        return await self.double.wait_for("POST", path, timeout=timeout, consume=False)

    async def answer(self, timeout: float = 10.0) -> Recorded:
        """What the user first reads in reply: the callback's message, or, after a defer ("thinking…"),
        the first followup or edit of the deferred message (whichever the bot sent first)."""
        callback = await self.response(timeout)
        if (callback.json or {}).get("type") != 5:
            return callback
        token = re.escape(self.token)
        followup, edit = rf"/webhooks/\d+/{token}", rf"/webhooks/\d+/{token}/messages/@original"

        def first() -> Recorded | None:
            return next(
                (
                    c
                    for c in self.double.calls
                    if c.status < 300
                    and (
                        (c.method == "POST" and re.fullmatch(followup, c.path))
                        or (c.method == "PATCH" and re.fullmatch(edit, c.path))
                    )
                ),
                None,
            )

        return await self.double.wait_until(first, timeout, f"an answer to interaction {self.id}")

    async def followups(self, count: int = 1, timeout: float = 5.0) -> list[Recorded]:
        """Followup posts to this interaction's webhook, refused ones included (see ``status``)."""
        path = rf"/webhooks/\d+/{re.escape(self.token)}"
        await self.double.wait_until(
            lambda: len(self.double.calls_to("POST", path)) >= count, timeout, f"{count} followup(s) to {self.id}"
        )
        return self.double.calls_to("POST", path)

    async def choices(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The autocomplete suggestions the bot answered with."""
        body = (await self.response(timeout)).json
        assert body["type"] == 8, f"expected an autocomplete result (8), got callback type {body['type']}"
        return body["data"]["choices"]

    @property
    def original(self) -> StoredMessage | None:
        return None if self.original_id is None else self.double.message(self.original_id)


Handler = Callable[..., Any]


class DiscordDouble:
    """``async with DiscordDouble() as double:`` serves on a free loopback port and points discord.py at it.

    ``strict=True`` enforces the interaction deadline: a callback arriving more than ``interaction_deadline``
    seconds after the dispatch is answered 404 10062 Unknown interaction, and followups to an interaction that
    was never acknowledged 404 10015. In both modes webhook calls more than ``token_lifetime`` seconds after the
    dispatch are answered 404 10015 Unknown Webhook, and handles record when their first callback came.

    Route.BASE and DiscordWebSocket.DEFAULT_GATEWAY are pointed on entry and restored on exit, whoever changed
    them in between, so a test cannot leak a loopback URL into the next one.
    """

    def __init__(
        self,
        guilds: list[Guild] | None = None,
        *,
        bot: User | None = None,
        bot_permissions: int = DEFAULT_PERMISSIONS,
        shard_count: int = 1,
        heartbeat_interval_ms: int = 41_250,
        attachment_size_limit: int = DEFAULT_ATTACHMENT_SIZE_LIMIT,
        token: str | None = None,
        strict: bool = False,
        interaction_deadline: float = 3.0,
        token_lifetime: float = 900.0,
        listen: str = "127.0.0.1",
        address: str | None = None,
    ) -> None:
        # ``listen`` is where it serves; ``address`` is how the bot reaches it (a container reaches the host at its
        # bridge's gateway, tests/stack.py), by default ``listen``.
        self.listen, self.address = listen, address or listen
        self.strict = strict
        self.interaction_deadline = interaction_deadline
        self.token_lifetime = token_lifetime
        self.token = token  # when set, REST calls with any other bot token get 401
        self.guilds = guilds if guilds is not None else [Guild()]
        self.bot = bot or User("animegamer", bot=True)
        self.bot_member = Member(user=self.bot, permissions=bot_permissions)
        self.application_id = self.bot.id
        self.player = member("player")
        self.shard_count = shard_count  # what GET /gateway/bot recommends
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.attachment_size_limit = attachment_size_limit

        self.calls: list[Recorded] = []
        self.commands: dict[int | None, list[dict[str, Any]]] = {}  # guild id (None: global) -> synced commands
        self.sync_count = 0
        self.heartbeats = 0
        self.sessions: dict[str, Session] = {}
        self.shards: dict[int, Session] = {}  # shard id -> its latest session
        self.gateway_refused = False  # an outage: every gateway connection is refused (gateway_outage)
        self.modals: dict[str, dict[str, Any]] = {}  # custom_id -> the modal the bot opened
        self.interactions: dict[str, InteractionHandle] = {}
        self.faults: list[Fault] = []
        self._dm_channels: dict[int, Channel] = {}  # recipient's user id -> the DM channel
        self._seen_users: dict[int, User] = {}  # users the double sent as interaction authors or options
        self._messages: dict[int, StoredMessage] = {}
        self._by_nonce: dict[tuple[int, str], StoredMessage] = {}
        self._consumed: set[int] = set()
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._saved: tuple[str, yarl.URL] | None = None
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = [
            (method, re.compile(pattern), handler)
            for method, pattern, handler in [
                ("GET", r"/users/@me", lambda rec: self.bot.payload()),
                ("GET", r"/users/(?P<uid>\d+)", self._get_user),
                ("GET", r"/oauth2/applications/@me", self._application),
                ("GET", r"/gateway", lambda rec: {"url": self.gateway_url}),
                ("GET", r"/gateway/bot", self._gateway_bot),
                ("PUT", r"/applications/\d+(?:/guilds/(?P<guild>\d+))?/commands", self._put_commands),
                ("GET", r"/applications/\d+(?:/guilds/(?P<guild>\d+))?/commands", self._get_commands),
                ("POST", r"/interactions/(?P<iid>\d+)/(?P<token>[^/]+)/callback", self._callback),
                ("POST", r"/webhooks/\d+/(?P<token>[^/]+)", self._followup),
                ("GET", r"/webhooks/\d+/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._webhook_message),
                ("PATCH", r"/webhooks/\d+/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._webhook_message),
                ("DELETE", r"/webhooks/\d+/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._webhook_message),
                ("POST", r"/channels/(?P<cid>\d+)/messages", self._create_channel_message),
                ("GET", r"/channels/\d+/messages/(?P<mid>\d+)", self._channel_message),
                ("PATCH", r"/channels/\d+/messages/(?P<mid>\d+)", self._channel_message),
                ("DELETE", r"/channels/\d+/messages/(?P<mid>\d+)", self._channel_message),
                ("POST", r"/channels/\d+/typing", lambda rec: None),
                ("GET", r"/channels/(?P<cid>\d+)", self._get_channel),
                ("GET", r"/guilds/(?P<gid>\d+)/members/(?P<uid>\d+)", self._get_member),
                ("POST", r"/users/@me/channels", self._open_dm),
            ]
        ]

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def __aenter__(self) -> DiscordDouble:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/attachments/{cid}/{aid}/{filename}", self._attachment)
        app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind((self.listen, 0))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        self._saved = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
        self.point()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._saved is not None:
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = self._saved
        for session in self.sessions.values():
            if session.ws is not None:
                await session.ws.close(code=1001)
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def origin(self) -> str:
        return f"http://{self.address}:{self._port}"

    @property
    def api_base(self) -> str:
        return self.origin + API_PREFIX

    def api_base_for(self, host: str) -> str:
        """The API reached by another name for this server (``localhost``): faults given that ``host`` take only
        the requests of the processes told to use it."""
        return f"http://{host}:{self._port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self.address}:{self._port}/gateway"

    @property
    def guild(self) -> Guild:
        return self.guilds[0]

    def point(self, client: discord.Client | None = None) -> None:
        """Aim discord.py here; given a client, also drop the waits that only pace real Discord.

        discord.py sleeps 5 s before every IDENTIFY but the first (the identify rate limit) and waits
        ``guild_ready_timeout`` (2 s) after the last GUILD_CREATE before ``on_ready``.
        """
        discord.http.Route.BASE = self.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.gateway_url)
        if client is not None:

            async def identify_now(shard_id: int | None, *, initial: bool = False) -> None:
                return None

            client.before_identify_hook = identify_now  # type: ignore[method-assign]
            client._connection.guild_ready_timeout = 0.2

    @asynccontextmanager
    async def running(
        self, client: ClientT, token: str = "test-token", timeout: float = 10.0
    ) -> AsyncIterator[ClientT]:
        """Start ``client`` against the double, yield once it is ready, close it afterwards."""
        self.point(client)
        task = asyncio.create_task(client.start(token))
        ready = asyncio.create_task(client.wait_until_ready())
        try:
            done, _ = await asyncio.wait({task, ready}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                task.result()  # raises the reason it stopped
                raise AssertionError("the client stopped before it was ready")
            if not done:
                raise AssertionError(f"the client was not ready after {timeout}s; REST calls: {self._summary()}")
            yield client
        finally:
            ready.cancel()
            await client.close()
            with suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=5.0)

    # -- waiting and inspecting --------------------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until ``predicate()`` is truthy, re-checking whenever a call, frame or session changes."""
        try:
            async with self._changed:
                return await asyncio.wait_for(self._changed.wait_for(predicate), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; calls: {self._summary()}") from None

    def _summary(self) -> str:
        return ", ".join(f"{c.method} {c.path} -> {c.status}" for c in self.calls[-20:]) or "none"

    def calls_to(self, method: str, path_regex: str) -> list[Recorded]:
        return [c for c in self.calls if c.method == method.upper() and re.fullmatch(path_regex, c.path)]

    async def wait_for(self, method: str, path_regex: str, timeout: float = 5.0, consume: bool = True) -> Recorded:
        """The first matching call that no earlier ``wait_for`` returned; waits for it if none came yet."""

        def first() -> Recorded | None:
            return next((c for c in self.calls_to(method, path_regex) if id(c) not in self._consumed), None)

        call: Recorded = await self.wait_until(first, timeout, f"{method} {path_regex}")
        if consume:
            self._consumed.add(id(call))
        return call

    def messages(self, channel_id: int | None = None) -> list[StoredMessage]:
        """Messages the bot created and did not delete, oldest first (ephemeral ones included)."""
        return [
            m for m in self._messages.values() if not m.deleted and (channel_id is None or m.channel_id == channel_id)
        ]

    def message(self, message_id: int) -> StoredMessage | None:
        return self._messages.get(message_id)

    def dms(self, user: User | Member | int) -> list[StoredMessage]:
        """What the bot sent to ``user``'s DM channel, oldest first."""
        user_id = user if isinstance(user, int) else user.id
        channel = self._dm_channels.get(user_id)
        return self.messages(channel.id) if channel else []

    def late_interactions(self) -> list[InteractionHandle]:
        """Interactions whose first callback missed the deadline, or that have none once it passed."""
        return [h for h in self.interactions.values() if h.late]

    def bot_permissions_in(self, channel: Channel) -> int:
        """The channel's ``bot_permissions``, else its parent's (threads), else the bot member's guild ones."""
        perms = channel.bot_permissions
        if perms is None and channel.parent_id is not None:
            parent = self._channel(channel.parent_id)
            perms = parent.bot_permissions if parent else None
        if perms is None:
            return self.bot_member.computed_permissions
        return ALL_PERMISSIONS if perms & ADMINISTRATOR else perms

    # -- faults and changes ------------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path_regex: str,
        *,
        status: int = 500,
        code: int = 0,
        message: str | None = None,
        times: int | None = 1,
        delay: float = 0.0,
        retry_after: float | None = None,
        host: str | None = None,
    ) -> Fault:
        """Answer the next ``times`` matching REST requests (None: all, until cleared) with an error.

        ``method`` "*" takes every method. ``path_regex`` is fullmatched against the path after /api/v10, as in
        ``calls_to``. ``delay`` holds the request that long (or until the fault is cleared) before answering;
        ``status=0`` then handles the request as usual (a slow Discord). ``status=429`` is a rate limit
        (``retry_after`` seconds, default 1) that discord.py sleeps out and retries. ``host`` takes only the requests
        of a process that reaches Discord by that name (``api_base_for("localhost")``): one process of a fleet sees
        the fault. Faulted requests are still recorded in ``calls`` with the status they got.
        """
        if message is None:
            message = "You are being rate limited." if status == 429 else _status_message(status)
        if status == 429 and retry_after is None:
            retry_after = 1.0
        fault = Fault(method.upper(), re.compile(path_regex), status, code, message, times, delay, retry_after, host)
        self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        for fault in self.faults:
            fault.clear()
        self.faults.clear()

    async def archive(self, thread: Channel) -> None:
        """Archive a thread, telling the client (THREAD_UPDATE); posts to it then get 400 50083."""
        assert thread.is_thread, f"{thread.name} is not a thread (type {thread.type})"
        thread.archived, thread.archive_timestamp = True, now_iso()
        await self.dispatch("THREAD_UPDATE", thread.payload(), guild_id=thread.guild_id)

    async def delete_channel(self, channel: Channel) -> None:
        """Delete a channel (and its threads) or a thread, telling the client; posts to it then get 404 10003."""
        guild = self._guild(channel.guild_id)
        assert guild is not None and channel in guild.channels, f"{channel.name} is in none of the double's guilds"
        guild.channels = [c for c in guild.channels if c is not channel and c.parent_id != channel.id]
        if channel.is_thread:
            data = {"id": str(channel.id), "guild_id": str(guild.id), "parent_id": str(channel.parent_id)}
            await self.dispatch("THREAD_DELETE", {**data, "type": channel.type}, guild_id=guild.id)
        else:
            await self.dispatch("CHANNEL_DELETE", channel.payload(), guild_id=guild.id)

    # -- gateway -----------------------------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self.gateway_refused:
            return web.Response(status=503, text="upstream connect error")  # as a gateway behind a proxy answers
        # The client asks for zlib-stream; it accepts plain text frames all the same, so none are compressed.
        ws = web.WebSocketResponse(timeout=1.0)
        await ws.prepare(request)
        session: Session | None = None
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                op, data = frame.get("op"), frame.get("d")
                if op == 1:
                    self.heartbeats += 1
                    # A real gateway's ack takes a network round trip. An instant one can reach discord.py
                    # before its keep-alive thread records the send, which it then reports as the whole
                    # heartbeat interval of latency ("Can't keep up, ... 41.3s behind").
                    await asyncio.sleep(HEARTBEAT_ACK_DELAY)
                    await ws.send_json({"op": 11})
                elif op == 2:
                    session = await self._identify(ws, data)
                elif op == 6:
                    session = await self._resume(ws, data)
                elif op == 8:
                    await self._send_member_chunk(session, data)
                await self._notify()
        finally:
            if session is not None and session.ws is ws:
                session.ws = None
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> Session:
        shard_id, shard_count = data.get("shard") or (0, 1)
        session = Session(uuid.uuid4().hex, shard_id, shard_count, data, ws)
        self.sessions[session.id] = session
        self.shards[shard_id] = session
        guilds = [g for g in self.guilds if shard_for(g.id, shard_count) == shard_id]
        ready: dict[str, Any] = {
            "v": 10,
            "user": {**self.bot.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.id,
            "resume_gateway_url": self.gateway_url,
            "application": {"id": str(self.application_id), "flags": 0},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "geo_ordered_rtc_regions": [],
        }
        if "shard" in data:
            ready["shard"] = [shard_id, shard_count]
        await self._send_event(session, "READY", ready)
        for guild in guilds:
            session.guild_ids.append(guild.id)
            await self._send_event(session, "GUILD_CREATE", guild.payload(self.bot_member))
        return session

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> Session | None:
        session = self.sessions.get(data.get("session_id", ""))
        if session is None:
            await ws.send_json({"op": 9, "d": False})
            return None
        session.ws, session.resumes = ws, session.resumes + 1
        self.shards[session.shard_id] = session
        for frame in session.sent:
            if frame["s"] > (data.get("seq") or 0):
                await ws.send_json(frame)
        await self._send_event(session, "RESUMED", {})
        return session

    async def _send_member_chunk(self, session: Session | None, data: dict[str, Any]) -> None:
        """Answer the chunk request a client with the members intent makes for every guild at startup."""
        guild = self._guild(int(data["guild_id"]))
        if session is None or guild is None:
            return
        wanted = {int(u) for u in data.get("user_ids") or []}
        members = [
            m
            for m in [*guild.members, self.bot_member]
            if (not wanted or m.id in wanted) and m.user.username.startswith(data.get("query") or "")
        ]
        chunk = {
            "guild_id": str(guild.id),
            "members": [m.payload() for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [],
            "nonce": data.get("nonce"),
        }
        await self._send_event(session, "GUILD_MEMBERS_CHUNK", chunk)

    async def _send_event(self, session: Session, event: str, data: dict[str, Any]) -> None:
        session.seq += 1
        frame = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.sent.append(frame)
        if session.ws is not None and not session.ws.closed:
            await session.ws.send_json(frame)

    async def wait_connected(self, shards: int = 1, timeout: float = 5.0) -> None:
        await self.wait_until(
            lambda: all(s in self.shards and self.shards[s].ws is not None for s in range(shards)),
            timeout,
            f"{shards} shard(s) to identify",
        )

    async def dispatch(self, event: str, data: dict[str, Any], *, guild_id: int | None = None) -> None:
        """Send a gateway event to the shard that owns ``guild_id`` (shard 0 without one)."""
        await self._send_event(await self._session_for(guild_id), event, data)

    async def _session_for(self, guild_id: int | None) -> Session:
        await self.wait_until(lambda: self.shards, 5.0, "a gateway session")
        count = next(iter(self.shards.values())).shard_count
        shard = shard_for(guild_id, count) if guild_id is not None else 0
        await self.wait_until(lambda: shard in self.shards, 5.0, f"shard {shard} to identify")
        latest = self.shards[shard]
        if latest.ws is None:  # its process stopped: another session of the shard (a rolling deploy's old bot)
            live = [s for s in self.sessions.values() if s.shard_id == shard and s.ws is not None]
            return live[-1] if live else latest
        return latest

    @contextlib.asynccontextmanager
    async def gateway_outage(self, shard_id: int = 0) -> AsyncIterator[None]:
        """The gateway goes away: the shard's connection is dropped and every new one refused until the block ends;
        then the client connects again."""
        session = self.shards[shard_id]
        assert session.ws is not None, f"shard {shard_id} is not connected"
        self.gateway_refused = True
        try:
            await session.ws.close(code=1011)  # a server error: the client reconnects, and is refused
            yield
        finally:
            self.gateway_refused = False
        await self.wait_until(lambda: self.shards[shard_id].ws is not None, 60.0, f"shard {shard_id} to reconnect")

    async def reconnect(self, shard_id: int = 0) -> None:
        """Ask the client to reconnect (op 7); it comes back with RESUME on READY's resume_gateway_url."""
        session = self.shards[shard_id]
        resumes = session.resumes
        assert session.ws is not None, f"shard {shard_id} is not connected"
        await session.ws.send_json({"op": 7, "d": None})
        await self.wait_until(lambda: session.resumes > resumes and session.ws, 10.0, f"shard {shard_id} to resume")

    # -- driving interactions ----------------------------------------------------------------------------

    async def slash(
        self,
        command: str,
        options: dict[str, Any] | None = None,
        *,
        user: Member | User | None = None,
        guild_id: int | None = None,
        channel_id: int | None = None,
        resolved: dict[str, Any] | None = None,
        **context: Any,
    ) -> InteractionHandle:
        """Invoke ``/command``; "story start" reaches a subcommand, "a b c" one inside a group.

        Option types come from the synced schema, so the command must have been synced (as on Discord).
        Users, members, channels and roles given as option values are put in ``resolved`` for you.
        """
        data = self._command_data(command, options or {}, guild_id, resolved, focused=None)
        return await self._interact(2, data, user=user, guild_id=guild_id, channel_id=channel_id, **context)

    async def autocomplete(
        self,
        command: str,
        focused: str,
        value: str,
        options: dict[str, Any] | None = None,
        *,
        user: Member | User | None = None,
        guild_id: int | None = None,
        channel_id: int | None = None,
        **context: Any,
    ) -> InteractionHandle:
        """What the client sends while a user types ``value`` into option ``focused``."""
        data = self._command_data(command, {**(options or {}), focused: value}, guild_id, None, focused=focused)
        return await self._interact(4, data, user=user, guild_id=guild_id, channel_id=channel_id, **context)

    async def button(
        self, message: StoredMessage | int | None, custom_id: str, *, user: Member | User | None = None, **context: Any
    ) -> InteractionHandle:
        """Click ``custom_id`` on a message the bot sent (or, given none, on one it sent before a restart)."""
        return await self._component(message, custom_id, 2, None, user, context)

    async def select(
        self,
        message: StoredMessage | int | None,
        custom_id: str,
        values: list[str],
        *,
        user: Member | User | None = None,
        **context: Any,
    ) -> InteractionHandle:
        return await self._component(message, custom_id, 3, values, user, context)

    async def modal_submit(
        self,
        custom_id: str,
        values: dict[str, str],
        *,
        user: Member | User | None = None,
        guild_id: int | None = None,
        channel_id: int | None = None,
        **context: Any,
    ) -> InteractionHandle:
        rows = [{"type": 1, "components": [{"type": 4, "custom_id": k, "value": v}]} for k, v in values.items()]
        data = {"custom_id": custom_id, "components": rows}
        return await self._interact(5, data, user=user, guild_id=guild_id, channel_id=channel_id, **context)

    async def _component(
        self,
        message: StoredMessage | int | None,
        custom_id: str,
        component_type: int,
        values: list[str] | None,
        user: Member | User | None,
        context: dict[str, Any],
    ) -> InteractionHandle:
        stored = self.message(message) if isinstance(message, int) else message
        if stored is None:
            stored = self._store(self.guild.channel.id, {"components": [component_row(custom_id, values)]}, [])
        data: dict[str, Any] = {"custom_id": custom_id, "component_type": component_type}
        if values is not None:
            data["values"] = values
        handle = await self._interact(
            3,
            data,
            user=user,
            guild_id=stored.guild_id,
            channel_id=stored.channel_id,
            message=stored.payload(),
            **context,
        )
        handle.original_id = stored.id
        return handle

    def _command_data(
        self,
        command: str,
        options: dict[str, Any],
        guild_id: int | None,
        resolved: dict[str, Any] | None,
        focused: str | None,
    ) -> dict[str, Any]:
        name, *path = command.split()
        for value in options.values():
            if isinstance(value, Member | User):
                self._seen_users[value.id] = value if isinstance(value, User) else value.user
        guild = self._guild(guild_id) or self.guild
        scope, schema = next(
            (
                (scope, c)
                for scope in (guild.id, None)
                for c in self.commands.get(scope, [])
                if c["name"] == name and c.get("type", 1) == 1
            ),
            (None, None),
        )
        if schema is None:
            synced = sorted(c["name"] for cs in self.commands.values() for c in cs)
            raise LookupError(f"/{name} was never synced (synced: {synced}); call bot.tree.sync() first")
        found: dict[str, Any] = {}
        data: dict[str, Any] = {
            "id": schema["id"],
            "name": name,
            "type": 1,
            "options": command_options(command, schema.get("options", []), path, options, focused, found),
        }
        if scope is not None:
            data["guild_id"] = str(scope)
        for kind, objects in (resolved or {}).items():
            found.setdefault(kind, {}).update(objects)
        if found:
            data["resolved"] = found
        return data

    async def _interact(
        self,
        type: int,
        data: dict[str, Any],
        *,
        user: Member | User | None,
        guild_id: int | None,
        channel_id: int | None,
        message: dict[str, Any] | None = None,
        locale: str = "en-US",
        attachment_size_limit: int | None = None,
        app_permissions: int | None = None,
    ) -> InteractionHandle:
        guild = self._guild(guild_id) if guild_id is not None else self.guild
        if guild is None:
            raise LookupError(f"no guild {guild_id}; the double has {[g.id for g in self.guilds]}")
        channel = guild.get_channel(channel_id) if channel_id is not None else guild.channel
        if channel is None:
            raise LookupError(f"no channel {channel_id} in guild {guild.id}")
        who = user if isinstance(user, Member) else Member(user=user) if user is not None else self.player
        self._seen_users[who.id] = who.user
        if app_permissions is None:
            app_permissions = self.bot_permissions_in(channel)
        payload = interaction_payload(
            type=type,
            data=data,
            application_id=self.application_id,
            guild=guild,
            channel=channel,
            user=who,
            app_permissions=app_permissions,
            attachment_size_limit=attachment_size_limit or self.attachment_size_limit,
            locale=locale,
            message=message,
        )
        interaction_id = snowflake()
        token = f"itoken-{interaction_id}-{uuid.uuid4().hex}"
        payload.update(id=str(interaction_id), token=token)
        handle = InteractionHandle(self, interaction_id, token, type, guild.id, channel.id, payload)
        self.interactions[token] = handle
        session = await self._session_for(guild.id)
        handle.dispatched_at = time.monotonic()  # before sending: the client may answer before send returns
        await self._send_event(session, "INTERACTION_CREATE", payload)
        return handle

    # -- REST --------------------------------------------------------------------------------------------

    async def _rest(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        body, files = await _read_body(request)
        path, headers = "/" + request.match_info["tail"], dict(request.headers)
        rec = Recorded(request.method, path, body, files, headers, dict(request.query), at=arrived)
        self._note_callback(rec)
        fault = next((f for f in self.faults if f.takes(rec)), None)
        if fault is not None:
            fault.hits += 1
            if fault.delay:  # held for ``delay``, or until the fault is cleared
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fault.released.wait(), fault.delay)
        if fault is not None and fault.status:
            result, extra = fault.answer()
            return await self._answer(rec, fault.status, result, extra)
        status, result = self._route(rec, request.headers.get("Authorization"))
        return await self._answer(rec, status, result)

    def _note_callback(self, rec: Recorded) -> None:
        match = re.fullmatch(r"/interactions/(?P<iid>\d+)/(?P<token>[^/]+)/callback", rec.path)
        handle = self.interactions.get(match["token"]) if match and rec.method == "POST" else None
        if handle is not None and handle.id == int(match["iid"]) and handle.first_callback_seconds is None:
            handle.first_callback_seconds = rec.at - handle.dispatched_at

    def _route(self, rec: Recorded, auth: str | None) -> tuple[int, Any]:
        """Auth is ``None`` on interaction and webhook calls, which carry no bot token."""
        status, result = 404, {"message": f"404: the double has no route for {rec.method} {rec.path}", "code": 0}
        if self.token is not None and auth is not None and auth != f"Bot {self.token}":
            # What Discord answers a wrong bot token; discord.py turns it into LoginFailure at login.
            status, result = 401, {"message": "401: Unauthorized", "code": 0}
        for method, pattern, handler in self._routes if status != 401 else []:
            match = pattern.fullmatch(rec.path)
            if method == rec.method and match:
                try:
                    status, result = 200, handler(rec, **match.groupdict())
                except ApiError as exc:
                    status, result = exc.status, {"message": exc.message, "code": exc.code}
                break
        if result is None and status == 200:
            status = 204
        return status, result

    async def _answer(
        self, rec: Recorded, status: int, result: Any, headers: dict[str, str] | None = None
    ) -> web.Response:
        rec.status = status
        self.calls.append(rec)
        log.debug("%s %s -> %s", rec.method, rec.path, status)
        await self._notify()
        if status == 204:
            return web.Response(status=204)
        # discord.py parses JSON only when the header is exactly this: no "; charset=utf-8".
        headers = {**(headers or {}), "Content-Type": "application/json"}
        return web.Response(status=status, body=json.dumps(result).encode(), headers=headers)

    async def _attachment(self, request: web.Request) -> web.Response:
        aid = int(request.match_info["aid"])
        for msg in self._messages.values():
            if aid in msg.files:
                return web.Response(body=msg.files[aid].data, content_type="application/octet-stream")
        raise web.HTTPNotFound()

    def _application(self, rec: Recorded) -> dict[str, Any]:
        return {
            "id": str(self.application_id),
            "name": self.bot.username,
            "description": "",
            "icon": None,
            "bot_public": True,
            "bot_require_code_grant": False,
            "owner": self.guild.owner.user.payload(),
            "team": None,
            "verify_key": "0" * 64,
            "flags": 0,
            "interactions_endpoint_url": None,
        }

    def _gateway_bot(self, rec: Recorded) -> dict[str, Any]:
        limit = {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
        return {"url": self.gateway_url, "shards": self.shard_count, "session_start_limit": limit}

    def _put_commands(self, rec: Recorded, guild: str | None) -> list[dict[str, Any]]:
        """Bulk overwrite; like Discord, a command keeps its id while its name and type stay the same."""
        scope = int(guild) if guild else None
        old = {(c["name"], c.get("type", 1)): c["id"] for c in self.commands.get(scope, [])}
        synced = []
        for cmd in rec.json:
            key = (cmd["name"], cmd.get("type", 1))
            synced.append(
                {
                    "type": 1,
                    "description": "",
                    "options": [],
                    "default_member_permissions": None,
                    "nsfw": False,
                    **cmd,
                    "id": old.get(key) or str(snowflake()),
                    "application_id": str(self.application_id),
                    "version": str(snowflake()),
                    **({"guild_id": guild} if guild else {}),
                }
            )
        self.commands[scope] = synced
        self.sync_count += 1
        return synced

    def _get_commands(self, rec: Recorded, guild: str | None) -> list[dict[str, Any]]:
        return self.commands.get(int(guild) if guild else None, [])

    def _callback(self, rec: Recorded, iid: str, token: str) -> dict[str, Any]:
        handle = self.interactions.get(token)
        if handle is None or handle.id != int(iid):
            raise ApiError(404, 10062, "Unknown interaction")
        if self.strict and rec.at - handle.dispatched_at > self.interaction_deadline:
            raise ApiError(404, 10062, "Unknown interaction")  # the token is no longer valid for a callback
        if handle.responded:
            raise ApiError(400, 40060, "Interaction has already been acknowledged.")
        handle.responded = True
        kind, data = rec.json["type"], rec.json.get("data") or {}
        message: StoredMessage | None = None
        if kind == 4:
            message = self._store(handle.channel_id, data, rec.files, webhook=True)
            handle.original_id = message.id
        elif kind == 5:
            flags = (data.get("flags") or 0) | LOADING
            message = self._store(handle.channel_id, {"flags": flags}, [], webhook=True)
            handle.original_id, handle.deferred = message.id, True
        elif kind in (6, 7) and handle.original:
            message = handle.original
            if kind == 7:
                message.apply(data, rec.files, self._attachment_url)
        elif kind == 9:
            self.modals[data["custom_id"]] = data
        interaction = {
            "id": iid,
            "type": handle.type,
            "response_message_loading": kind == 5,
            "response_message_ephemeral": bool(message and message.ephemeral),
        }
        if message is None:
            return {"interaction": interaction}
        interaction["response_message_id"] = str(message.id)
        return {"interaction": interaction, "resource": {"type": kind, "message": message.payload()}}

    def _handle(self, rec: Recorded, token: str) -> InteractionHandle:
        handle = self.interactions.get(token)
        if handle is None or rec.at - handle.dispatched_at > self.token_lifetime:
            raise ApiError(404, 10015, "Unknown Webhook")
        if self.strict and not handle.responded:
            raise ApiError(404, 10015, "Unknown Webhook")  # an interaction never acknowledged has no webhook
        return handle

    def _followup(self, rec: Recorded, token: str) -> dict[str, Any]:
        handle = self._handle(rec, token)
        if handle.deferred and handle.original and not handle.original.deleted:
            handle.deferred = False
            message = handle.original
            message.flags &= ~LOADING
            payload = {k: v for k, v in (rec.json or {}).items() if k != "flags"}  # the defer's flags stand
            message.apply(payload, rec.files, self._attachment_url)
        else:
            message = self._store(handle.channel_id, rec.json or {}, rec.files, webhook=True)
        return message.payload()

    def _webhook_message(self, rec: Recorded, token: str, mid: str) -> dict[str, Any] | None:
        handle = self._handle(rec, token)
        if mid == "@original":
            handle.deferred = False  # editing the "thinking" message replaces it
            message_id = handle.original_id
        else:
            message_id = int(mid)
        return self._message_op(rec, message_id)

    def _channel_message(self, rec: Recorded, mid: str) -> dict[str, Any] | None:
        return self._message_op(rec, int(mid))

    def _message_op(self, rec: Recorded, message_id: int | None) -> dict[str, Any] | None:
        message = self.message(message_id) if message_id is not None else None
        if message is None or message.deleted:
            raise ApiError(404, 10008, "Unknown Message")
        if rec.method == "DELETE":
            message.deleted = True
            return None
        if rec.method == "PATCH":
            message.flags &= ~LOADING
            message.apply(rec.json or {}, rec.files, self._attachment_url)
            message.edited_timestamp = now_iso()
        return message.payload()

    def _create_channel_message(self, rec: Recorded, cid: str) -> dict[str, Any]:
        channel = self._channel(int(cid))
        if channel is None:
            raise ApiError(404, 10003, "Unknown Channel")
        payload = self._allowed_post(channel, rec.json or {}, rec.files)
        # Discord's enforce_nonce: the same nonce from the same author in the same channel, within a
        # few minutes, returns the message already created instead of a second one.
        nonce = payload.get("nonce") if payload.get("enforce_nonce") else None
        if nonce is not None and (int(cid), nonce) in self._by_nonce:
            return self._by_nonce[int(cid), nonce].payload()
        message = self._store(int(cid), payload, rec.files)
        if nonce is not None:
            self._by_nonce[int(cid), nonce] = message
        return message.payload()

    def _allowed_post(self, channel: Channel, payload: dict[str, Any], files: list[UploadedFile]) -> dict[str, Any]:
        """Refuse a post as Discord would, or return what it keeps of it (embeds go without EMBED_LINKS)."""
        if channel.type == DM:
            recipient = self._user(channel.recipient.id) if channel.recipient else None
            if recipient is not None and not recipient.dms_open:
                raise ApiError(403, 50007, "Cannot send messages to this user")
            return payload
        perms = self.bot_permissions_in(channel)
        if not perms & VIEW_CHANNEL:
            raise ApiError(403, 50001, "Missing Access")
        if not perms & (SEND_MESSAGES_IN_THREADS if channel.is_thread else SEND_MESSAGES):
            raise ApiError(403, 50013, "Missing Permissions")
        if channel.is_thread and (channel.archived or channel.locked):
            raise ApiError(400, 50083, "Thread is archived")
        if (files and not perms & ATTACH_FILES) or (
            payload.get("message_reference") and not perms & READ_MESSAGE_HISTORY
        ):
            raise ApiError(403, 50013, "Missing Permissions")
        if not perms & EMBED_LINKS:
            return {k: v for k, v in payload.items() if k != "embeds"}
        return payload

    def _open_dm(self, rec: Recorded) -> dict[str, Any]:
        """Discord hands back the same DM channel for the same recipient every time."""
        user_id = int((rec.json or {})["recipient_id"])
        channel = self._dm_channels.get(user_id)
        if channel is None:
            recipient = self._user(user_id) or User(f"user{user_id}", id=user_id)
            channel = self._dm_channels[user_id] = Channel(recipient.username, type=DM, recipient=recipient)
        return channel.payload()

    def _get_channel(self, rec: Recorded, cid: str) -> dict[str, Any]:
        channel = self._channel(int(cid))
        if channel is None:
            raise ApiError(404, 10003, "Unknown Channel")
        return channel.payload()

    def _get_user(self, rec: Recorded, uid: str) -> dict[str, Any]:
        found = self._user(int(uid))
        if found is None:
            raise ApiError(404, 10013, "Unknown User")
        return found.payload()

    def _get_member(self, rec: Recorded, gid: str, uid: str) -> dict[str, Any]:
        guild = self._guild(int(gid))
        if guild is None:
            raise ApiError(404, 10004, "Unknown Guild")
        found = self.bot_member if int(uid) == self.bot.id else guild.get_member(int(uid))
        if found is None:
            raise ApiError(404, 10007, "Unknown Member")
        return found.payload()

    # -- state -------------------------------------------------------------------------------------------

    def _guild(self, guild_id: int | None) -> Guild | None:
        return next((g for g in self.guilds if g.id == guild_id), None)

    def _channel(self, channel_id: int) -> Channel | None:
        channels = [*(c for g in self.guilds for c in g.channels), *self._dm_channels.values()]
        return next((c for c in channels if c.id == channel_id), None)

    def _user(self, user_id: int) -> User | None:
        """A user the double knows: the bot, the default player, a guild member, or one it sent in an interaction."""
        members = [self.player, *(m for g in self.guilds for m in g.members)]
        found = next((m.user for m in members if m.id == user_id), None)
        return found or self._seen_users.get(user_id) or (self.bot if user_id == self.bot.id else None)

    def _attachment_url(self, channel_id: int, attachment_id: int, filename: str) -> str:
        return f"{self.origin}/attachments/{channel_id}/{attachment_id}/{filename}"

    def _store(
        self, channel_id: int, payload: dict[str, Any], files: list[UploadedFile], *, webhook: bool = False
    ) -> StoredMessage:
        channel = self._channel(channel_id)
        message = StoredMessage(
            id=snowflake(),
            channel_id=channel_id,
            guild_id=channel.guild_id if channel else None,
            author=self.bot,
            webhook_id=self.application_id if webhook else None,
        )
        message.apply(payload, files, self._attachment_url)
        self._messages[message.id] = message
        return message


def _status_message(status: int) -> str:
    try:
        return f"{status}: {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status}: Error"


async def _read_body(request: web.Request) -> tuple[Any, list[UploadedFile]]:
    """JSON, or multipart with ``payload_json`` and ``files[n]`` parts (the only shapes discord.py sends)."""
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        parts: list[tuple[int, UploadedFile]] = []
        reader = await request.multipart()
        async for part in reader:
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            elif part.name and (match := re.fullmatch(r"files\[(\d+)\]", part.name)):
                content_type = part.headers.get("Content-Type", "application/octet-stream")
                data = bytes(await part.read())
                parts.append((int(match[1]), UploadedFile(part.filename or part.name, data, content_type)))
        return payload, [f for _, f in sorted(parts, key=lambda p: p[0])]
    text = await request.text() if request.can_read_body else ""
    return (json.loads(text) if text else None), []
