"""A loopback Discord (gateway + REST) that the real discord.py client runs against in tests."""

from .payloads import (
    ADMINISTRATOR,
    ALL_PERMISSIONS,
    DEFAULT_PERMISSIONS,
    MANAGE_GUILD,
    Channel,
    Guild,
    Member,
    Role,
    StoredMessage,
    UploadedFile,
    User,
    member,
    shard_for,
    snowflake,
)
from .server import DiscordDouble, InteractionHandle, Recorded, Session

__all__ = [
    "ADMINISTRATOR",
    "ALL_PERMISSIONS",
    "DEFAULT_PERMISSIONS",
    "MANAGE_GUILD",
    "Channel",
    "DiscordDouble",
    "Guild",
    "InteractionHandle",
    "Member",
    "Recorded",
    "Role",
    "Session",
    "StoredMessage",
    "UploadedFile",
    "User",
    "member",
    "shard_for",
    "snowflake",
]
