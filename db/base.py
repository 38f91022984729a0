"""The declarative base every model shares, and the column shapes they repeat.

Constraint names follow one convention so a later revision can drop or alter them by name;
SQLite's batch mode (copy table, move data, swap) cannot touch an unnamed constraint.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from sqlalchemy import BigInteger, DateTime, Dialect, MetaData, func
from sqlalchemy.ext.asyncio import AsyncAttrs
from sqlalchemy.orm import DeclarativeBase, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite has no time zones: it hands back naive values (``CURRENT_TIMESTAMP`` is UTC), while
    PostgreSQL's ``timestamptz`` hands back aware ones. Normalising here means callers can
    subtract and compare timestamps the same way on both backends.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"refusing a naive datetime {value!r}: pass an aware one, e.g. datetime.now(UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


# Repeated column shapes. ``Mapped[Snowflake | None]`` gives the nullable variant.
IntPK = Annotated[int, mapped_column(primary_key=True)]
Snowflake = Annotated[int, mapped_column(BigInteger)]  # Discord ids are 64-bit and exceed INTEGER on PostgreSQL
Timestamp = Annotated[datetime, mapped_column(UtcDateTime())]
CreatedAt = Annotated[datetime, mapped_column(UtcDateTime(), server_default=func.now())]


class Base(AsyncAttrs, DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
