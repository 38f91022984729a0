"""What a turn costs Redis with large bytes by reference (the default) against all of them inline.

    python benchmarks/queue_bytes.py [--turns 3]

On a redis-server of its own, with one tiny-model worker at a time: the request messages exactly as Celery leaves
them in the queue (window 1; window 5 with four published-size 226 x 1920 float16 representations), then turns
played as the bot plays them (send, poll the stored state every 0.1 s, read the result, forget it), at window 1
and at window 5, counting the bytes Redis received (INFO total_net_input_bytes) and the memory a finished turn
holds in Redis until the bot reads it (MEMORY USAGE of its result, blob and claim keys; kept a day at most).
Everything is measured twice: with ANIMEGAMER_INLINE_MAX_BYTES at its default, and with it so large that every
blob rides inline. Prints the median bytes per turn, their ratio to the clip, and inline over by-reference, from
this one run.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import torch
from safetensors.torch import save as save_safetensors

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from game.contract import TASK_NAME, HistoryTurn, TurnRequest, TurnResult  # noqa: E402
from game.state import StateDeltas  # noqa: E402
from relay.blob_store import store_for  # noqa: E402
from relay.celery_app import make_celery  # noqa: E402
from relay.control import Holder, RedisControl  # noqa: E402
from relay.settings import Settings  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402
from tests.workers import Worker, settings_for, start_worker, worker_env  # noqa: E402

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
DELTAS = StateDeltas(motion=1, social=0, entertainment=1, stamina=-1)
ALL_INLINE = str(2**40)


def received(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


def message_bytes(client: redis.Redis, settings: Settings, history: list[HistoryTurn]) -> int:
    queue = f"unread-{uuid.uuid4().hex[:8]}"
    request = store_for(settings).pack_request(TurnRequest(job_id=queue, instruction=LINE, seed=1, history=history))
    make_celery(settings).send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=queue, queue=queue)
    size = len(client.lindex(queue, 0) or b"")
    client.delete(queue)
    return size


def held_for(client: redis.Redis, job_id: str) -> int:
    """Bytes of Redis memory one finished turn holds until the bot reads it: its result, blobs and claim keys."""
    return sum(client.memory_usage(key) or 0 for key in client.scan_iter(match=f"*{job_id}*"))


def play(worker: Worker, client: redis.Redis, url: str, history: list[HistoryTurn]) -> tuple[TurnResult, int, int]:
    settings = settings_for(worker.env)
    blobs, app, control = store_for(settings), worker.app, RedisControl(url, 3.0)
    job_id = f"bytes-{uuid.uuid4().hex[:8]}"
    request = blobs.pack_request(TurnRequest(job_id=job_id, instruction=LINE, seed=1, history=history))
    before = received(client)
    app.send_task(TASK_NAME, args=[request.model_dump(mode="json")], task_id=job_id)
    while (meta := app.backend.get_task_meta(job_id, cache=False))["status"] != "SUCCESS":
        if meta["status"] == "FAILURE":
            raise RuntimeError(meta["result"])
        time.sleep(0.1)
    while control.holders([job_id])[job_id] is not Holder.ENDED:
        time.sleep(0.1)
    held = held_for(client, job_id)  # what a result left unread costs, for as long as it is kept (a day)
    stored = TurnResult.model_validate(meta["result"])
    result = blobs.resolve_result(stored)
    app.AsyncResult(job_id).forget()
    blobs.drop_result(stored)  # as the bot does once it has recorded the result
    return result, received(client) - before, held


def measure(folder: Path, server: RedisServer, inline_max: str | None, turns: int) -> dict[str, float]:
    extra = {"ANIMEGAMER_INLINE_MAX_BYTES": inline_max} if inline_max else {}
    env = worker_env(folder, server.url(), **extra)
    settings, client = settings_for(env), redis.Redis(port=server.port)
    published = [
        save_safetensors({"representation": torch.randn(226, 1920, generator=torch.Generator().manual_seed(i)).half()})
        for i in range(4)
    ]
    figures: dict[str, float] = {
        "window 1 request on Redis": message_bytes(client, settings, []),
        "window 5 request on Redis (226 x 1920)": message_bytes(
            client, settings, [HistoryTurn(instruction=LINE, representation=r, deltas=DELTAS) for r in published]
        ),
    }
    worker = start_worker(env)
    try:
        first, _, _ = play(worker, client, server.url(), [])  # warm-up: the child's first turn
        past = [HistoryTurn(instruction=LINE, representation=first.representation, deltas=first.deltas)] * 4
        for window, history in ((1, []), (5, past)):
            played = [play(worker, client, server.url(), history) for _ in range(turns)]
            used = statistics.median(b for _, b, _ in played)
            clip = statistics.median(len(r.mp4) for r, _, _ in played)
            figures[f"window {window} turn into Redis"] = used
            figures[f"window {window} turn / clip"] = used / clip
            figures[f"window {window} unread result, Redis memory"] = statistics.median(h for _, _, h in played)
        figures["clip"] = clip
        figures["representation (tiny, float16)"] = len(first.representation)
    finally:
        worker.kill(signal.SIGTERM)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    default = Settings().inline_max_bytes
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            by_reference = measure(Path(tmp) / "by-reference", server, None, args.turns)
            inline = measure(Path(tmp) / "inline", server, ALL_INLINE, args.turns)
        finally:
            server.stop()
    print(f"{'bytes':<40} {f'inline max {default}':>18} {'all inline':>14} {'inline / by ref':>16}")
    for name, value in by_reference.items():
        ratio = inline[name] / value if value else float("nan")
        fmt = ".2f" if "/" in name else ",.0f"
        print(f"{name:<40} {value:>18{fmt}} {inline[name]:>14{fmt}} {ratio:>16.1f}")


if __name__ == "__main__":
    main()
