"""Discord API objects as the double's tests describe them, and the JSON Discord would send for them.

The builders fill every field discord.py reads with ``data[...]`` so that a test only names what it is about
(who clicks, whether they may manage the server) and the client never trips on a missing key.
"""

from __future__ import annotations

import itertools
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

DISCORD_EPOCH_MS = 1_420_070_400_000
MANAGE_GUILD = 1 << 5
ADMINISTRATOR = 1 << 3
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
EMBED_LINKS = 1 << 14
ATTACH_FILES = 1 << 15
READ_MESSAGE_HISTORY = 1 << 16
SEND_MESSAGES_IN_THREADS = 1 << 38
ALL_PERMISSIONS = (1 << 51) - 1
# What @everyone may do on a fresh server: read, talk, attach, use commands.
DEFAULT_PERMISSIONS = (
    (1 << 6) | (1 << 10) | (1 << 11) | (1 << 14) | (1 << 15) | (1 << 16) | (1 << 18) | (1 << 31) | (1 << 38)
)
DEFAULT_ATTACHMENT_SIZE_LIMIT = 10 * 1024 * 1024
EPHEMERAL, LOADING = 1 << 6, 1 << 7  # message flags

OPTION_TYPES = {str: 3, bool: 5, int: 4, float: 10}  # when a test passes an option the schema does not type

_counter = itertools.count(1)
_base_ms = 1_700_000_000_000 - DISCORD_EPOCH_MS


def snowflake() -> int:
    """A unique id whose timestamp part also advances, so consecutive guilds land on different shards."""
    n = next(_counter)
    return ((_base_ms + n) << 22) | (n & 0xFFF)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def shard_for(guild_id: int, shard_count: int) -> int:
    """Discord's routing rule: https://discord.com/developers/docs/events/gateway#sharding."""
    return (guild_id >> 22) % shard_count


@dataclass
class User:
    username: str = "player"
    id: int = field(default_factory=snowflake)
    global_name: str | None = None
    avatar: str | None = None
    discriminator: str = "0"
    bot: bool = False
    dms_open: bool = True  # False: the user blocks DMs from server members, so the bot's DM post gets 403 50007

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "username": self.username,
            "global_name": self.global_name if self.global_name is not None else self.username.title(),
            "avatar": self.avatar,
            "discriminator": self.discriminator,
            "bot": self.bot,
            "public_flags": 0,
        }


@dataclass
class Member:
    """A user in one guild; ``permissions`` is what Discord computes for them (roles plus overwrites)."""

    user: User = field(default_factory=User)
    permissions: int = DEFAULT_PERMISSIONS
    roles: list[int] = field(default_factory=list)
    nick: str | None = None
    joined_at: str = field(default_factory=now_iso)

    @property
    def id(self) -> int:
        return self.user.id

    @property
    def computed_permissions(self) -> int:
        return ALL_PERMISSIONS if self.permissions & ADMINISTRATOR else self.permissions

    def payload(self, *, with_permissions: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "user": self.user.payload(),
            "roles": [str(r) for r in self.roles],
            "nick": self.nick,
            "avatar": None,
            "joined_at": self.joined_at,
            "premium_since": None,
            "communication_disabled_until": None,
            "deaf": False,
            "mute": False,
            "pending": False,
            "flags": 0,
        }
        if with_permissions:
            data["permissions"] = str(self.computed_permissions)
        return data


def member(username: str = "player", *, manage_guild: bool = False, administrator: bool = False, **user: Any) -> Member:
    """A member whose permissions say only what the test is about."""
    perms = DEFAULT_PERMISSIONS | (MANAGE_GUILD if manage_guild else 0) | (ADMINISTRATOR if administrator else 0)
    return Member(user=User(username=username, **user), permissions=perms)


@dataclass
class Role:
    name: str
    id: int = field(default_factory=snowflake)
    permissions: int = DEFAULT_PERMISSIONS
    position: int = 1

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "name": self.name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": self.position,
            "permissions": str(self.permissions),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }


DM, TEXT, PUBLIC_THREAD = 1, 0, 11  # channel types
THREAD_TYPES = (10, 11, 12)


@dataclass
class Channel:
    """A guild channel, thread or DM.

    ``bot_permissions`` is what the bot may do here (None: its guild permissions, or a thread's parent's); the
    double enforces it on ``POST /channels/{id}/messages``, sends it as the interaction's ``app_permissions`` and
    shows it to discord.py as a member overwrite, so ``channel.permissions_for(guild.me)`` agrees.
    A thread (``type=11``) needs ``parent_id``; ``Guild`` fills it with its first channel when left None.
    """

    name: str = "general"
    id: int = field(default_factory=snowflake)
    type: int = TEXT
    position: int = 0
    guild_id: int | None = None
    bot_permissions: int | None = None
    parent_id: int | None = None  # threads
    archived: bool = False
    locked: bool = False
    auto_archive_duration: int = 1440
    archive_timestamp: str = field(default_factory=now_iso)
    owner_id: int | None = None  # who started the thread; Guild fills in its owner
    recipient: User | None = None  # DMs
    nsfw: bool = False  # Discord's "age-restricted channel"; a thread is as its parent

    @property
    def is_thread(self) -> bool:
        return self.type in THREAD_TYPES

    def payload(self, *, bot_id: int | None = None, base_permissions: int = DEFAULT_PERMISSIONS) -> dict[str, Any]:
        """Given the bot's id, a channel with ``bot_permissions`` carries the overwrite that yields them."""
        if self.type == DM:
            recipients = [self.recipient.payload()] if self.recipient else []
            return {"id": str(self.id), "type": DM, "last_message_id": None, "recipients": recipients, "flags": 0}
        data: dict[str, Any] = {
            "id": str(self.id),
            "type": self.type,
            "name": self.name,
            "position": self.position,
            "permission_overwrites": [],
            "nsfw": self.nsfw,
            "parent_id": str(self.parent_id) if self.parent_id is not None else None,
            "topic": None,
            "rate_limit_per_user": 0,
            "last_message_id": None,
            "flags": 0,
        }
        if self.guild_id is not None:
            data["guild_id"] = str(self.guild_id)
        if self.is_thread:
            data["owner_id"] = str(self.owner_id or 0)
            data["message_count"] = data["member_count"] = data["total_message_sent"] = 0
            data["thread_metadata"] = {
                "archived": self.archived,
                "locked": self.locked,
                "auto_archive_duration": self.auto_archive_duration,
                "archive_timestamp": self.archive_timestamp,
                "create_timestamp": self.archive_timestamp,
                "invitable": True,
            }
        elif bot_id is not None and self.bot_permissions is not None:
            wanted = ALL_PERMISSIONS if self.bot_permissions & ADMINISTRATOR else self.bot_permissions
            allow, deny = wanted & ~base_permissions, base_permissions & ~wanted
            data["permission_overwrites"] = [{"id": str(bot_id), "type": 1, "allow": str(allow), "deny": str(deny)}]
        return data


def thread(name: str = "thread", parent: Channel | None = None, **fields: Any) -> Channel:
    """A public thread; under the guild's first channel unless ``parent`` says otherwise."""
    return Channel(name, type=PUBLIC_THREAD, parent_id=parent.id if parent else None, **fields)


@dataclass
class Guild:
    name: str = "Test Guild"
    id: int = field(default_factory=snowflake)
    owner: Member = field(default_factory=lambda: member("owner", administrator=True))
    channels: list[Channel] = field(default_factory=lambda: [Channel("general")])
    roles: list[Role] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    preferred_locale: str = "en-US"

    def __post_init__(self) -> None:
        for channel in self.channels:
            channel.guild_id = self.id
            if channel.is_thread:
                channel.parent_id = channel.parent_id or next(c.id for c in self.channels if not c.is_thread)
                channel.owner_id = channel.owner_id or self.owner.id
        if self.owner not in self.members:
            self.members.insert(0, self.owner)

    @property
    def channel(self) -> Channel:
        """The first text channel, where tests talk unless they say otherwise."""
        return self.channels[0]

    def everyone(self) -> Role:
        return Role("@everyone", id=self.id, position=0)

    def get_channel(self, channel_id: int) -> Channel | None:
        return next((c for c in self.channels if c.id == channel_id), None)

    def get_member(self, user_id: int) -> Member | None:
        return next((m for m in self.members if m.id == user_id), None)

    def payload(self, bot: Member) -> dict[str, Any]:
        """The GUILD_CREATE body: discord.py builds its whole guild cache from this one event."""
        members = [*self.members, bot]
        base = self.everyone().permissions  # the bot has no roles, so discord.py starts from @everyone's
        return {
            "id": str(self.id),
            "name": self.name,
            "icon": None,
            "owner_id": str(self.owner.id),
            "unavailable": False,
            "large": False,
            "member_count": len(members),
            "joined_at": bot.joined_at,
            "preferred_locale": self.preferred_locale,
            "features": [],
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "system_channel_id": None,
            "afk_channel_id": None,
            "roles": [r.payload() for r in [self.everyone(), *self.roles]],
            "emojis": [],
            "stickers": [],
            # Like Discord, only the active threads: discord.py drops a thread from its cache once archived.
            "channels": [c.payload(bot_id=bot.id, base_permissions=base) for c in self.channels if not c.is_thread],
            "threads": [c.payload() for c in self.channels if c.is_thread and not c.archived],
            "members": [m.payload() for m in members],
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }


class UploadedFile(NamedTuple):
    """One ``files[n]`` part of a multipart request, kept whole so tests can check the bytes."""

    filename: str
    data: bytes
    content_type: str


def attachment_payload(attachment_id: int, upload: UploadedFile, url: str) -> dict[str, Any]:
    """What Discord answers for an uploaded file; it guesses the type from the name, not the part header."""
    guessed, _ = mimetypes.guess_type(upload.filename)
    return {
        "id": str(attachment_id),
        "filename": upload.filename,
        "size": len(upload.data),
        "url": url,
        "proxy_url": url,
        "content_type": guessed or upload.content_type,
    }


@dataclass
class StoredMessage:
    """A message the bot created, as the double remembers it; ``payload()`` is what Discord would return."""

    id: int
    channel_id: int
    guild_id: int | None
    author: User
    content: str = ""
    embeds: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    files: dict[int, UploadedFile] = field(default_factory=dict)  # attachment id -> bytes
    flags: int = 0
    message_reference: dict[str, Any] | None = None
    allowed_mentions: dict[str, Any] | None = None
    webhook_id: int | None = None
    timestamp: str = field(default_factory=now_iso)
    edited_timestamp: str | None = None
    deleted: bool = False

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)

    def custom_ids(self) -> list[str]:
        """Every custom_id in the components, however deeply nested (rows, sections, containers)."""
        found: list[str] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                if "custom_id" in node:
                    found.append(node["custom_id"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(self.components)
        return found

    def apply(self, payload: dict[str, Any], files: list[UploadedFile], url: Callable[[int, int, str], str]) -> None:
        """Create or edit: keys present replace, keys absent stay; attachments keep listed ids and add files[n]."""
        for key in ("content", "embeds", "components"):
            if key in payload:
                setattr(self, key, payload[key] or type(getattr(self, key))())
        for key in ("message_reference", "allowed_mentions"):
            if key in payload:
                setattr(self, key, payload[key])
        if "flags" in payload:
            self.flags = (payload["flags"] or 0) | (self.flags & LOADING)
        if "attachments" not in payload and not files:
            return
        entries = payload.get("attachments")
        if entries is None:
            entries = [*self.attachments, *({"id": n} for n in range(len(files)))]
        kept = {a["id"]: a for a in self.attachments}
        attachments, uploads = [], {}
        for entry in entries:
            key = str(entry["id"])
            if key in kept:
                attachments.append(kept[key])
                uploads[int(key)] = self.files[int(key)]
            elif int(key) < len(files):
                upload = files[int(key)]._replace(filename=entry.get("filename") or files[int(key)].filename)
                aid = snowflake()
                attachments.append(attachment_payload(aid, upload, url(self.channel_id, aid, upload.filename)))
                uploads[aid] = upload
        self.attachments, self.files = attachments, uploads

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(self.id),
            "channel_id": str(self.channel_id),
            "type": 19 if self.message_reference else 0,
            "content": self.content,
            "author": self.author.payload(),
            "embeds": self.embeds,
            "components": self.components,
            "attachments": self.attachments,
            "mentions": [],
            "mention_roles": [],
            "mention_everyone": False,
            "pinned": False,
            "tts": False,
            "timestamp": self.timestamp,
            "edited_timestamp": self.edited_timestamp,
            "flags": self.flags,
        }
        if self.guild_id is not None:
            data["guild_id"] = str(self.guild_id)
        if self.message_reference is not None:
            data["message_reference"] = self.message_reference
        if self.webhook_id is not None:
            data["webhook_id"] = str(self.webhook_id)
            data["application_id"] = str(self.webhook_id)
        return data


def interaction_payload(
    *,
    type: int,
    data: dict[str, Any],
    application_id: int,
    guild: Guild | None,
    channel: Channel | None,
    user: Member,
    app_permissions: int,
    attachment_size_limit: int,
    locale: str = "en-US",
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An INTERACTION_CREATE body; ``id`` and ``token`` are filled in by the double."""
    payload: dict[str, Any] = {
        "type": type,
        "version": 1,
        "application_id": str(application_id),
        "data": data,
        "locale": locale,
        "app_permissions": str(app_permissions),
        "entitlements": [],
        "attachment_size_limit": attachment_size_limit,
        "authorizing_integration_owners": {"0": str(guild.id)} if guild else {"1": str(user.id)},
        "context": 0 if guild else 1,
    }
    if guild is not None:
        payload["guild_id"] = str(guild.id)
        payload["guild_locale"] = guild.preferred_locale
        payload["guild"] = {"id": str(guild.id), "locale": guild.preferred_locale, "features": []}
        payload["member"] = user.payload(with_permissions=True)
    else:
        payload["user"] = user.user.payload()
    if channel is not None:
        payload["channel"] = {**channel.payload(), "permissions": str(user.computed_permissions)}
        payload["channel_id"] = str(channel.id)
    if message is not None:
        payload["message"] = message
    return payload


def command_options(
    command: str,
    schema: list[dict[str, Any]],
    path: list[str],
    values: dict[str, Any],
    focused: str | None,
    resolved: dict[str, Any],
) -> list[dict[str, Any]]:
    """Typed and nested as Discord sends them: a group (2) holds a subcommand (1) holds the values.

    The types come from the synced schema, because discord.py converts values by the type the option claims.
    """
    specs = {o["name"]: o for o in schema}
    if path:
        sub = specs.get(path[0])
        if sub is None or sub["type"] not in (1, 2):
            raise LookupError(f"/{command}: no subcommand or group {path[0]!r} (has {sorted(specs)})")
        nested = command_options(command, sub.get("options", []), path[1:], values, focused, resolved)
        return [{"name": path[0], "type": sub["type"], "options": nested}]
    options = []
    for name, value in values.items():
        if name not in specs:
            raise LookupError(f"/{command} has no option {name!r} (has {sorted(specs)})")
        option_type = specs[name].get("type") or OPTION_TYPES[type(value)]
        option: dict[str, Any] = {"name": name, "type": option_type, "value": resolve_option(value, resolved)}
        if name == focused:
            option["focused"] = True
        options.append(option)
    return options


def resolve_option(value: Any, resolved: dict[str, Any]) -> Any:
    """Option values that are objects go into ``resolved`` and travel as their id, as Discord sends them."""
    if isinstance(value, Member | User):
        who = value if isinstance(value, Member) else Member(user=value)
        resolved.setdefault("users", {})[str(who.id)] = who.user.payload()
        if isinstance(value, Member):
            fields = who.payload(with_permissions=True)
            del fields["user"]
            resolved.setdefault("members", {})[str(who.id)] = fields
        return str(who.id)
    if isinstance(value, Channel):
        channel = {**value.payload(), "permissions": str(DEFAULT_PERMISSIONS)}
        resolved.setdefault("channels", {})[str(value.id)] = channel
        return str(value.id)
    if isinstance(value, Role):
        resolved.setdefault("roles", {})[str(value.id)] = value.payload()
        return str(value.id)
    return value


def component_row(custom_id: str, values: list[str] | None) -> dict[str, Any]:
    """A one-component row, enough for discord.py to rebuild a view around a clicked DynamicItem."""
    if values is None:
        component: dict[str, Any] = {"type": 2, "style": 2, "label": custom_id[:80], "custom_id": custom_id}
    else:
        options = [{"label": v, "value": v} for v in values]
        component = {"type": 3, "custom_id": custom_id, "options": options, "min_values": 1, "max_values": 1}
    return {"type": 1, "components": [component]}
