"""Write the README's picture: five frames of each of the first demo turns, as the default (toy) model plays them.

    python scripts/demo_frames.py --out docs/demo_frames.png [--turns 4] [--checkpoint PATH]

Runs the pipeline in-process (no worker), with each turn's history as the game builds it (``--window``), and
decodes the MP4s the players get, so the picture shows what a user sees, H.264 included. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from game.contract import HistoryTurn, TurnRequest  # noqa: E402
from game.history import past_turns_for  # noqa: E402
from game.instruction import parse  # noqa: E402
from media.mp4 import decode_mp4  # noqa: E402
from worker.pipeline.toy import load_toy_pipeline  # noqa: E402

FRAMES = (0, 4, 8, 12, 16)
SCALE = 2
CAPTION = 14  # pixels of text above each row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "demo_frames.png")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, default=None, help="a toy model file (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--window", type=int, default=1, help="history window, as ANIMEGAMER_HISTORY_WINDOW (1: none)")
    args = parser.parse_args()

    lines = [line for line in (REPO / "game" / "data" / "demo.txt").read_text().splitlines() if line.strip()]
    pipeline = load_toy_pipeline(args.checkpoint)
    played: list[HistoryTurn] = []
    history: list[HistoryTurn] = []
    rows = []
    for turn, line in enumerate(lines[: args.turns], 1):
        instruction = str(parse(line))
        request = TurnRequest(job_id=f"frames-{turn}", instruction=instruction, seed=args.seed + turn, history=history)
        result = pipeline(request)
        frames = decode_mp4(result.mp4)  # (T, H, W, 3)
        played.append(HistoryTurn(instruction=instruction, representation=result.representation, deltas=result.deltas))
        history = past_turns_for(played, args.window)
        strip = np.concatenate([frames[i] for i in FRAMES], axis=1)  # (H, 5 W, 3)
        rows.append((f"{turn}. {instruction}", strip))

    height, width = rows[0][1].shape[0] * SCALE, rows[0][1].shape[1] * SCALE
    sheet = Image.new("RGB", (width, len(rows) * (height + CAPTION)), (17, 17, 17))
    draw = ImageDraw.Draw(sheet)
    for index, (caption, strip) in enumerate(rows):
        top = index * (height + CAPTION)
        draw.text((2, top + 1), caption, fill=(230, 230, 230))
        sheet.paste(Image.fromarray(strip).resize((width, height), Image.NEAREST), (0, top + CAPTION))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(args.out, optimize=True)
    print(
        f"Wrote {args.out} ({len(rows)} turns, frames {', '.join(map(str, FRAMES))} of each; {pipeline.config.label})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
