"""`make stack`: compose.yaml run as an operator runs it, the bot played through the loopback Discord double.

Not part of `make test`: it needs a Docker daemon and takes minutes. `scripts/stack.sh` builds the images first
(on a local Debian base where no registry answers); this brings the stack up with the worker on the CPU and the
tiny model (random weights) and two bot processes that share no volume (clips in the stack's SeaweedFS), plays a
turn, takes the whole stack down (containers gone, volumes kept), brings it up again and plays on from the state the
first turn left: the character, its history and the queue survive. Its .env holds passwords with / # ? @ + = in
them, as an operator's may, and the worker's container is checked to hold no Discord token, database URL or store
key. It prints what `animegamer check` says from inside a bot's container and the seconds each phase took.

    python -m tests.stack [--keep]   (--keep leaves the stack and its volumes up afterwards)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import av

from tests.bot.helpers import accepted, private_text
from tests.discord_double import DiscordDouble, Recorded, member

REPO = Path(__file__).resolve().parent.parent
PROJECT = "animegamer-stack"
ALICE = member("alice")
UP_SECONDS = 300.0  # the first start migrates PostgreSQL and loads the model; each is seconds here
TURN_SECONDS = 180.0
WORKER_NEVER_HOLDS = {"DISCORD_TOKEN", "ANIMEGAMER_DATABASE_URL", "POSTGRES_PASSWORD", "AWS_SECRET_ACCESS_KEY"}


def compose_command() -> list[str] | None:
    """`docker compose` (v2) where the plugin is there, else `docker-compose` (v1, Debian's); None: neither."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


class Stack:
    def __init__(self, env: dict[str, str], env_file: Path) -> None:
        self.env = env
        command = compose_command()
        if command is None:
            raise SystemExit("no docker compose here: install the compose plugin or docker-compose")
        self.base = [*command, "-p", PROJECT, "-f", str(REPO / "compose.yaml"), "--env-file", str(env_file)]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.base, *args], env=self.env, cwd=REPO, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done

    def up(self) -> None:
        self.run("up", "-d", "bot", "worker-cpu")

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).stdout.split()

    def health(self, service: str) -> str:
        """One word per container of the service ("running healthy", ...), joined; "absent" with none."""
        states = [
            subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", container],
                capture_output=True,
                text=True,
            ).stdout.strip()
            for container in self.containers(service)
        ]
        return " / ".join(states) or "absent"

    def environment(self, service: str) -> dict[str, str]:
        (container, *_) = self.containers(service)
        shown = subprocess.run(
            ["docker", "inspect", "-f", "{{json .Config.Env}}", container], capture_output=True, text=True
        )
        return dict(line.split("=", 1) for line in json.loads(shown.stdout))

    async def healthy(self, services: dict[str, int] = {"bot": 2, "worker-cpu": 1}) -> None:  # noqa: B006
        deadline = time.monotonic() + UP_SECONDS
        wanted = {s: " / ".join(["running healthy"] * n) for s, n in services.items()}
        while (states := {s: self.health(s) for s in services}) != wanted:
            if time.monotonic() > deadline or any(
                "exited" in state or "restarting" in state for state in states.values()
            ):
                logs = self.run("logs", "--tail", "60", check=False).stdout
                raise SystemExit(f"the stack did not get healthy: {states}\n{logs[-6000:]}")
            await asyncio.sleep(1)


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge: what a container dials to reach the double."""

    def inspect(template: str) -> str:
        done = subprocess.run(
            ["docker", "network", "inspect", "bridge", "-f", template], capture_output=True, text=True
        )
        return done.stdout.strip()

    if gateway := inspect("{{range .IPAM.Config}}{{.Gateway}}{{end}}"):
        return gateway
    interface = inspect('{{index .Options "com.docker.network.bridge.name"}}') or "docker0"
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show", interface], capture_output=True, text=True).stdout
    return re.search(r"inet ([\d.]+)/", shown)[1]


def frames(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


async def play_a_turn(double: DiscordDouble, motion: str) -> Recorded:
    """/act, then the channel message that carries its clip."""
    act = await double.slash("act", {"motion": motion, "background": "town"}, user=ALICE)
    await accepted(act)
    deadline = time.monotonic() + TURN_SECONDS
    while time.monotonic() < deadline:
        post = await double.wait_for("POST", r"/channels/\d+/messages", timeout=deadline - time.monotonic())
        if any(f.filename.endswith(".mp4") for f in post.files):
            return post
    raise SystemExit(f"no clip for {motion!r} within {TURN_SECONDS:.0f} s")


async def history(double: DiscordDouble) -> list[str]:
    handle = await double.slash("history", {}, user=ALICE)
    return [line for line in private_text(await handle.answer(timeout=30)).splitlines() if line.startswith("•")]


def clip_frames(post: Recorded) -> int:
    return frames(next(f.data for f in post.files if f.filename.endswith(".mp4")))


def password() -> str:
    """As `openssl rand -base64` makes them, with every character a URL reserves for good measure."""
    return f"{secrets.token_urlsafe(12)}/#?@+="


def operator_env(double: DiscordDouble) -> str:
    """What an operator writes: .env.example copied, the token set (shaped as Discord's are: the bot's id in
    base64, then two random parts), the three passwords, and here the loopback Discord and quicker delivery polls."""
    token_id = base64.urlsafe_b64encode(str(double.bot.id).encode()).decode().rstrip("=")
    mine = {
        "DISCORD_TOKEN": f"{token_id}.{secrets.token_urlsafe(5)}.{secrets.token_urlsafe(27)}",
        "POSTGRES_PASSWORD": password(),
        "REDIS_PASSWORD": password(),
        "AWS_SECRET_ACCESS_KEY": password(),
        "DISCORD_API_BASE": double.api_base,
        "DISCORD_GATEWAY_URL": double.gateway_url,
        "ANIMEGAMER_DELIVERY_POLL_SECONDS": "0.5",
    }
    example = (REPO / ".env.example").read_text().splitlines()
    kept = [line for line in example if line.split("=", 1)[0] not in mine]
    return "\n".join([*kept, *(f"{key}={value}" for key, value in mine.items())]) + "\n"


async def main(keep: bool) -> None:
    times: dict[str, float] = {}
    gateway = bridge_gateway()
    async with DiscordDouble(listen="0.0.0.0", address=gateway) as double:
        with tempfile.TemporaryDirectory() as folder:
            env_file = Path(folder) / "stack.env"
            env_file.write_text(operator_env(double))
            env = {
                **os.environ,
                "ANIMEGAMER_MODEL": "tiny",
                "REDIS_IMAGE": os.environ.get("REDIS_IMAGE", "local/redis"),
                "POSTGRES_IMAGE": os.environ.get("POSTGRES_IMAGE", "local/postgres"),
                "SEAWEEDFS_IMAGE": os.environ.get("SEAWEEDFS_IMAGE", "local/seaweedfs"),
            }
            stack = Stack(env, env_file)
            stack.run("down", "-v", check=False)  # a stack a killed run left behind
            try:
                started = time.monotonic()
                stack.up()
                await stack.healthy()
                times["up, healthy (first start: migrations, model)"] = time.monotonic() - started

                checked = stack.run("exec", "-T", "bot", "animegamer", "check", check=False)
                print(f"animegamer check in the bot's container (exit {checked.returncode}):\n{checked.stdout}")
                held = set(stack.environment("worker-cpu")) & WORKER_NEVER_HOLDS
                assert not held, f"the worker's container holds {sorted(held)}"

                started = time.monotonic()
                start = await double.slash("start", {"character": "Qiqi"}, user=ALICE)
                await start.answer(timeout=30)
                first = await play_a_turn(double, "wave")
                times["first turn, /act to clip"] = time.monotonic() - started
                before = await history(double)

                started = time.monotonic()
                stack.run("down")  # containers gone; the named volumes stay
                times["down"] = time.monotonic() - started
                started = time.monotonic()
                stack.up()
                await stack.healthy()
                times["up again, healthy"] = time.monotonic() - started

                after = await history(double)
                started = time.monotonic()
                second = await play_a_turn(double, "jump")  # no /start: the character is still there
                times["second turn, /act to clip"] = time.monotonic() - started
                final = await history(double)
            finally:
                if not keep:
                    stack.run("down", "-v", check=False)

    assert (clip_frames(first), clip_frames(second)) == (17, 17), "a clip is not the model's 17 frames"
    assert len(before) == 1 and after == before, f"the restart lost the history: {before} -> {after}"
    assert len(final) == 2 and before[0] in final, f"the second turn did not follow the first: {final}"
    print(json.dumps({"history after both turns": final}, ensure_ascii=False, indent=1))
    for phase, seconds in times.items():
        print(f"stack: {phase}: {seconds:.1f} s")
    print("stack: OK (two turns, one across a full down/up, nothing lost)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="leave the stack up afterwards")
    asyncio.run(main(parser.parse_args().keep))
