"""How the bot holds up under a crowd: P players through the loopback Discord double, the README's load table.

    python benchmarks/load_players.py [--players 50,200,500] [--workers 1] [--steps 4]
                                      [--steady 500] [--flood 60] [--scaling 200]

Each row runs the real `animegamer bot` process against the double (tests.crowd), with tiny workers
(random weights, --steps denoising steps, so the bot is what is measured) on a Redis of the run's own:

- burst: P players spread over P/25 servers act at the same instant. Printed: the first answer to /act
  (p50, p99, max; Discord answers 10062 after 3 s: "late"), turns accepted, delivered once, duplicated,
  lost, the wall time to the last clip, clips per minute, /status's first answer (p99) asked every 0.2 s
  while the clips are made and posted, the bot's peak memory, and bytes sent to Redis per turn (and per
  clip byte). Beside it, the floor: benchmarks/bare_bot.py, a bot that only answers, under the same burst
  on the same double, and the ratio of the two p99s.
- steady (--steady N): N players each acting about once a minute (Poisson arrivals at N/60 a second) for
  a minute; the first answers' p99.
- fairness (--flood F): one server's F players act at once; 2 s later twenty quiet servers' players act
  once each. Printed: how long the quiet servers' turns waited for their clips, with the fair queue and
  with first come, first served (ANIMEGAMER_FAIR_QUEUE=false).
- scaling (--scaling P): the burst with one worker and with two; clips per minute and their ratio.

A measurement, not a test: tests/bot/test_load.py runs the P = 50 burst and asserts nothing is lost or
posted twice. Run it on a quiet machine; figures from a 2-core machine are in the README.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.crowd import (
    Answers,
    BotProcess,
    Prober,
    World,
    bare_argv,
    bot_argv,
    burst,
    count,
    crowd,
    discord_env,
    each_answered,
    first_answer_seconds,
    late,
    percentile,
    settle,
    setup_servers,
    steady,
)
from tests.discord_double import DiscordDouble, Guild, member
from tests.workers import worker_env

PLAYERS_PER_SERVER = 25


@dataclass
class Row:
    what: str
    players: int
    workers: int
    act: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)  # /act: dispatch to the player's queued (or refusal) message
    late: int = 0
    floor: list[float] = field(default_factory=list)  # the bare bot's first answers, same burst
    accepted: int = 0
    delivered: int = 0
    duplicates: int = 0
    lost: int = 0
    told: int = 0
    wall: float = 0.0
    status: list[float] = field(default_factory=list)
    card: list[float] = field(default_factory=list)  # /status: dispatch to the card itself
    peak_mb: float = 0.0
    redis_per_turn: float = 0.0
    clip_bytes: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def clips_per_minute(self) -> float:
        return 60 * self.delivered / self.wall if self.wall else 0.0


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.0f} s"


async def bare(folder: Path, players: int) -> list[float]:
    """The floor: the bare bot's first answers to the same burst."""
    guilds, crowd_ = crowd(players, max(1, players // PLAYERS_PER_SERVER))
    async with DiscordDouble(guilds, strict=True) as double:
        env = {**worker_env(folder), **discord_env(double)}
        bot = BotProcess(bare_argv(), env, folder / f"bare-{players}.log").start()
        try:
            await bot.ready(double, ("act",))
            handles = await burst(double, crowd_)
            await each_answered(double, handles)
            return first_answer_seconds(handles)
        finally:
            bot.stop()


async def ours(world: World, folder: Path, row: Row, arrivals: str = "burst", **settings: str) -> Row:
    guilds, players = crowd(row.players, max(1, row.players // PLAYERS_PER_SERVER))
    # A database of the run's own: one the bot has used would not sync its commands to this fresh double.
    database = Path(tempfile.mkdtemp(prefix=f"{row.what}-{row.players}-{row.workers}-", dir=folder)) / "game.db"
    async with DiscordDouble(guilds, strict=True) as double:
        bot = BotProcess(bot_argv(), world.bot_env(double, database, **settings), database.parent / "bot.log")
        bot.start()
        try:
            await bot.ready(double, ("act", "status", "start", "admin"))
            await setup_servers(double, guilds, players)
            before, started = world.redis_bytes_in(), time.monotonic()
            with Prober(double, players) as prober:
                if arrivals == "burst":
                    handles = await burst(double, players)
                else:
                    handles = await steady(double, players, rate=row.players / 60, seconds=60)
                await each_answered(double, handles)
                jobs = await settle(double, database, handles, timeout=60 + 3 * row.players)
            sent = world.redis_bytes_in() - before
            row.peak_mb = bot.peak_rss_mb()
        finally:
            bot.stop()
    outcome = count(double, jobs)
    row.act, row.late = first_answer_seconds(handles), late(handles)
    row.status = first_answer_seconds(prober.handles)
    answers = Answers(double)
    row.card = answers.seconds(prober.handles)
    row.queued = answers.seconds(handles)
    row.notes = [f"{n} told: {text}" for text, n in answers.refusals(handles).items()]
    row.accepted, row.delivered, row.duplicates = outcome.accepted, outcome.delivered_once, outcome.duplicates
    row.lost, row.told = outcome.lost, outcome.told
    row.wall = (outcome.last_clip_at - started) if outcome.last_clip_at else 0.0
    clips = [len(f.data) for c in double.calls if c.status == 200 for f in c.files if f.filename.endswith(".mp4")]
    row.clip_bytes = statistics.mean(clips) if clips else 0.0
    row.redis_per_turn = sent / max(1, outcome.accepted)
    return row


async def flood(world: World, folder: Path, flooders: int, fair: bool) -> tuple[list[float], list[float]]:
    """One busy server beside twenty quiet ones: (quiet servers' waits, the busy server's waits) in seconds."""
    busy = Guild(name="busy server")
    quiet = [Guild(name=f"quiet server {i}") for i in range(20)]
    from tests.crowd import Player

    flooding = [Player(member(f"flooder{i}"), busy) for i in range(flooders)]
    calm = [Player(member(f"calm{i}"), guild) for i, guild in enumerate(quiet)]
    database = folder / f"flood-{'fair' if fair else 'fifo'}" / "game.db"
    async with DiscordDouble([busy, *quiet], strict=True) as double:
        env = world.bot_env(double, database, fair_queue="true" if fair else "false")
        bot = BotProcess(bot_argv(), env, database.parent / "bot.log").start()
        try:
            await bot.ready(double, ("act", "start", "admin"))
            await setup_servers(double, [busy, *quiet], [*flooding, *calm])
            loud = await burst(double, flooding)
            await asyncio.sleep(2.0)
            soft = await burst(double, calm)
            jobs = await settle(double, database, [*loud, *soft], timeout=60 + 3 * (flooders + len(calm)))
        finally:
            bot.stop()
    outcome = count(double, jobs)
    dispatched = {int(h.payload["member"]["user"]["id"]): h.dispatched_at for h in [*loud, *soft]}
    waits = {
        user: outcome.posted_at[job] - dispatched[user] for job, _, user, _ in outcome.jobs if job in outcome.posted_at
    }
    calm_ids = {p.member.id for p in calm}
    return [w for u, w in waits.items() if u in calm_ids], [w for u, w in waits.items() if u not in calm_ids]


def print_rows(rows: list[Row]) -> None:
    """The table, then what players not given a turn were told (refusals are answers too, not losses)."""
    columns = [
        "arrivals", "P", "K", "/act first answer p50 / p99 / max", "late (10062)", "bare bot p99", "ratio",
        "queued message p99", "accepted", "delivered once", "duplicates", "lost", "to the last clip", "clips/min",
        "/status p99 (card p99)", "bot peak memory", "Redis bytes/turn (x clip)",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        floor = percentile(r.floor, 99) if r.floor else float("nan")
        cells = [
            r.what,
            r.players,
            r.workers,
            f"{ms(percentile(r.act, 50))} / {ms(percentile(r.act, 99))} / {ms(max(r.act, default=float('nan')))}",
            r.late,
            ms(floor),
            f"{percentile(r.act, 99) / floor:.1f}x" if r.floor else "-",
            ms(percentile(r.queued, 99)),
            r.accepted,
            r.delivered,
            r.duplicates,
            r.lost,
            f"{r.wall:.0f} s",
            f"{r.clips_per_minute:.0f}",
            f"{ms(percentile(r.status, 99))} ({ms(percentile(r.card, 99))})",
            f"{r.peak_mb:.0f} MB",
            f"{r.redis_per_turn / 1024:.0f} KB"
            + (f" ({r.redis_per_turn / r.clip_bytes:.1f}x)" if r.clip_bytes else ""),
        ]
        print("| " + " | ".join(map(str, cells)) + " |")
    for r in rows:
        for note in r.notes:
            print(f"  {r.what} P={r.players} K={r.workers}: {note}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--players", default="50,200,500", help="burst sizes, comma-separated ('' for none)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--steady", type=int, default=0, help="players acting about once a minute each")
    parser.add_argument("--flood", type=int, default=0, help="players of the one busy server")
    parser.add_argument("--scaling", type=int, default=0, help="burst size to run with one worker and two")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, databases)")
    args = parser.parse_args()

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="animegamer-load-") as tmp:
        folder = args.keep or Path(tmp)
        world = World(folder / "world", workers=args.workers, steps=args.steps)
        try:
            for players in [int(p) for p in args.players.split(",") if p]:
                row = await ours(world, folder, Row("burst", players, args.workers))
                row.floor = await bare(folder / "bare", players)
                rows.append(row)
                print_rows(rows[-1:])
            if args.steady:
                rows.append(await ours(world, folder, Row("steady", args.steady, args.workers), arrivals="steady"))
                print_rows(rows[-1:])
            if args.flood:
                fair_quiet, fair_busy = await flood(world, folder, args.flood, fair=True)
                fifo_quiet, fifo_busy = await flood(world, folder, args.flood, fair=False)
                print(f"\nOne server's {args.flood} players act at once, then 20 quiet servers' (K={args.workers}):")
                print("| queue | quiet servers' wait for their clip: median / max | the busy server's: median / max |")
                print("|---|---|---|")
                for name, quiet, busy in (
                    ("fair", fair_quiet, fair_busy),
                    ("first come, first served", fifo_quiet, fifo_busy),
                ):
                    print(
                        f"| {name} | {statistics.median(quiet):.1f} s / {max(quiet):.1f} s "
                        f"| {statistics.median(busy):.1f} s / {max(busy):.1f} s |"
                    )
            if args.scaling:
                scaled = []
                for workers in (1, 2):
                    world.stop_workers()
                    world.add_workers(workers)
                    scaled.append(await ours(world, folder, Row("burst", args.scaling, workers)))
                print_rows(scaled)
                print(
                    f"\nclips per minute, two workers against one: "
                    f"{scaled[1].clips_per_minute / scaled[0].clips_per_minute:.2f}x (this machine: "
                    f"{__import__('os').cpu_count()} cores shared by the bot, the double and the workers)"
                )
        finally:
            world.close()
    print("\nAll rows:")
    print_rows(rows)


if __name__ == "__main__":
    asyncio.run(main())
