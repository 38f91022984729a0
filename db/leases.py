"""Leases: a duty that one bot process does at a time, taken and renewed by guarded writes.

A lease is a row: its name, its holder and when it runs out. Taking one is an INSERT that does nothing
when the row exists, then an UPDATE guarded by "free, or already mine", so of two processes asking at
once exactly one gets it, on SQLite and PostgreSQL alike. A holder that stops gives it up (the next
asker takes it at once); one that dies keeps it until it runs out, which bounds the takeover.

Times are the database's clock (``database_now``), written and compared there, so a process whose own clock
is off (NTP not yet synced, a VM resumed from a pause) neither takes a live lease nor keeps a lapsed one. SQLite
lives in one process's machine, whose clock is then the database's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from db.models import Lease


async def database_now(session: AsyncSession) -> datetime:
    """The database's clock: PostgreSQL's, one for every process of a fleet; SQLite's is this machine's."""
    if session.get_bind().dialect.name == "postgresql":
        return (await session.execute(select(func.clock_timestamp()))).scalar_one().astimezone(UTC)
    return datetime.now(UTC)


async def _create(session: AsyncSession, name: str, holder: str, expires_at: datetime) -> bool:
    """Make the lease's row held by ``holder``: True if it did not exist (so no other asker made it first)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    created = await session.execute(
        dialect.insert(Lease).values(name=name, holder=holder, expires_at=expires_at).on_conflict_do_nothing()
    )
    return created.rowcount == 1


async def take(session: AsyncSession, name: str, holder: str, length: timedelta) -> bool:
    """Take or renew the lease for ``length`` from now on the database's clock: True if ``holder`` holds it now."""
    now = await database_now(session)
    return await take_at(session, name, holder, now + length, now)


async def take_at(session: AsyncSession, name: str, holder: str, until: datetime, now: datetime) -> bool:
    """``take`` at a given instant: True if ``holder`` holds the lease until ``until``, False if another does."""
    if await _create(session, name, holder, until):
        return True
    free_or_mine = (Lease.holder == holder) | (Lease.expires_at <= now)
    renewed = await session.execute(
        update(Lease).where(Lease.name == name, free_or_mine).values(holder=holder, expires_at=until)
    )
    return renewed.rowcount == 1


async def claim_due(session: AsyncSession, name: str, holder: str, next_due: datetime, now: datetime) -> bool:
    """A duty done once an interval by whichever process comes first: True for the one process whose claim moved
    the due time from the past to ``next_due``; False while it is not due (whoever did it last)."""
    if await _create(session, name, holder, next_due):
        return True
    claimed = await session.execute(
        update(Lease).where(Lease.name == name, Lease.expires_at <= now).values(holder=holder, expires_at=next_due)
    )
    return claimed.rowcount == 1


async def give_up(session: AsyncSession, name: str, holder: str) -> None:
    """Hand the lease back (a stopping process): the next process to ask takes it without waiting it out."""
    now = await database_now(session)
    await session.execute(update(Lease).where(Lease.name == name, Lease.holder == holder).values(expires_at=now))


async def holder_of(session: AsyncSession, name: str, now: datetime | None = None) -> str | None:
    """Who holds the lease now (on the database's clock), if anyone: what /readyz and the docs' fleet table show."""
    now = now or await database_now(session)
    return (
        await session.execute(select(Lease.holder).where(Lease.name == name, Lease.expires_at > now))
    ).scalar_one_or_none()


STANDING_IN = " (standing in)"  # a holder's suffix while it holds a lease for an owner that is gone


async def lock_in_order(session: AsyncSession, names: list[str], now: datetime) -> None:
    """Make the rows of these leases (free ones, where missing) and lock them in name order, before taking any of
    them: two processes renewing overlapping sets (each the owner of one shard and a stand-in for the other) then
    wait for each other instead of deadlocking (PostgreSQL aborted one of them, a renewal lost)."""
    names = sorted(names)
    if not names:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    free = [{"name": name, "holder": "", "expires_at": now} for name in names]
    await session.execute(dialect.insert(Lease).values(free).on_conflict_do_nothing())
    await session.execute(select(Lease.name).where(Lease.name.in_(names)).order_by(Lease.name).with_for_update())


async def take_many(
    session: AsyncSession, names: list[str], holder: str, until: datetime, now: datetime, *, owner: bool = False
) -> dict[str, datetime]:
    """Take or renew several leases: for each name ``holder`` holds until ``until``, the instant from which it may
    act on it (``now``, unless it took the lease from a live holder: then that holder's expiry). An ``owner`` also
    takes back a lease that a stand-in holds for it (``STANDING_IN``), so a restarted owner has its duty back at once
    and the stand-in learns so at its next renewal; the owner acts once the stand-in's lease would have run out,
    since until then the stand-in may still be sure it holds it."""
    if not names:
        return {}
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    rows = [{"name": name, "holder": holder, "expires_at": until} for name in names]
    await session.execute(dialect.insert(Lease).values(rows).on_conflict_do_nothing())
    before = dict(
        (
            await session.execute(
                select(Lease.name, Lease.expires_at)
                .where(Lease.name.in_(names), Lease.holder != holder)
                .with_for_update()
            )
        ).all()
    )  # locked (PostgreSQL) until the update: a live stand-in cannot renew in between
    takes = (Lease.holder == holder) | (Lease.expires_at <= now)
    if owner:
        takes |= Lease.holder.endswith(STANDING_IN)
    taken = await session.execute(
        update(Lease).where(Lease.name.in_(names), takes).values(holder=holder, expires_at=until).returning(Lease.name)
    )
    return {name: max(now, before.get(name, now)) for name in taken.scalars()}


async def give_up_all(session: AsyncSession, prefix: str, holders: list[str]) -> None:
    """Hand back every lease named ``prefix``... that these holders hold (a stopping process, under its names)."""
    now = await database_now(session)
    named = Lease.name.startswith(prefix, autoescape=True)
    await session.execute(update(Lease).where(named, Lease.holder.in_(holders)).values(expires_at=now))


class FleetClock:
    """The one clock every deadline of a fleet is written and compared on: the database's.

    ``sync`` measures how far this process's wall clock is from the database's (one read, each supervisor tick);
    ``now`` is the wall clock corrected by it. A bot whose clock runs 90 s ahead (NTP not yet synced, a VM resumed)
    then writes a turn's pickup deadline, its send and its start, and decides its expiry, as every other process
    does, instead of expiring turns the others still wait for (each one computed again on a GPU).
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)  # the database's clock minus this process's

    async def sync(self, session: AsyncSession) -> None:
        asked = datetime.now(UTC)
        self.offset = await database_now(session) - asked

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


async def live_holders(session: AsyncSession) -> set[str]:
    """The bot processes that hold a lease now (the outbox, a shard's posts): the live processes of this game, by
    the names they hold leases under (a stand-in's suffix dropped)."""
    now = await database_now(session)
    duties = (Lease.name == "outbox") | Lease.name.startswith("post:", autoescape=True)  # not retention's due time
    held = await session.execute(select(Lease.holder).where(duties, Lease.expires_at > now).distinct())
    return {holder.removesuffix(STANDING_IN) for holder in held.scalars()}
