"""The story page: one row per turn, the clip playing inline, the state as coloured bars.

Modelled on the release's Gradio table (round, instruction, clip, stamina/entertainment/social
bars coloured red under 30, yellow 30..60, green over 60), as one self-contained HTML file that
sits beside the clips it plays, or (a shared story's ``/story page``) carries them inside it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape

from game.contract import TOY_LABEL, is_random_weights
from game.state import CharacterState, StateDeltas, stat_colour

_COLOURS = {"red": "#e5484d", "yellow": "#f5d90a", "green": "#46a758"}


@dataclass(frozen=True)
class StoryRow:
    turn: int
    instruction: str
    clip: str  # file name relative to the page, or the clip itself as a data: URL (``embedded``); "" for none
    deltas: StateDeltas
    state: CharacterState
    seconds: float
    player: str = ""  # who played it, in a shared story


def embedded(mp4: bytes) -> str:
    """The clip as a ``data:`` URL, so the page plays it with nothing beside it: a page one can attach."""
    return "data:video/mp4;base64," + base64.b64encode(mp4).decode()


def render_story(rows: list[StoryRow], *, title: str, model: str, label: str, status: str) -> str:
    warning = ""
    if is_random_weights(label):
        warning = f'<p class="label">{escape(label)}: these clips are noise, not results.</p>'
    elif label == TOY_LABEL:
        warning = (
            '<p class="label">Trained on this machine\'s CPU (`animegamer train all`) on procedurally drawn clips of '
            "the toy world: 4 characters, 11 actions, 6 places, 4 times of day. Not the published anime model.</p>"
        )
    body = "\n".join(_row(row) for row in rows) or '<tr><td colspan="5">No turns yet.</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;background:#111;color:#eee}}
table{{border-collapse:collapse}} td,th{{padding:.5em 1em;border-bottom:1px solid #333;vertical-align:middle}}
video{{width:360px;image-rendering:pixelated;background:#000}}
.bar{{width:160px;height:12px;background:#333;border-radius:6px;overflow:hidden;margin:2px 0}}
.bar span{{display:block;height:100%}} .label{{color:#f5d90a;font-weight:bold}} .muted{{color:#999}}
</style></head><body>
<h1>{escape(title)}</h1>
<p>Model: <b>{escape(model)}</b>{f" ({escape(label)})" if label else ""}. {escape(status)}</p>
{warning}
<table><tr><th>Turn</th><th>Instruction</th><th>Clip</th><th>Changes</th><th>State</th></tr>
{body}
</table></body></html>
"""


def _row(row: StoryRow) -> str:
    d = row.deltas
    changes = (
        f"motion level {d.motion:+d}<br>stamina {d.stamina:+d}<br>"
        f"social {d.social:+d}<br>entertainment {d.entertainment:+d}"
    )
    bars = "".join(
        _bar(name, value)
        for name, value in (
            ("stamina", row.state.stamina),
            ("entertainment", row.state.entertainment),
            ("social", row.state.social),
        )
    )
    who = f"<div class='muted'>{escape(row.player)}</div>" if row.player else ""
    clip = (
        f'<video src="{escape(row.clip)}" autoplay loop muted playsinline controls></video>'
        if row.clip
        else "<span class='muted'>(clip not included)</span>"
    )
    return (
        f"<tr><td>{row.turn}</td><td>{escape(row.instruction)}{who}"
        f"<div class='muted'>{row.seconds:.1f} s</div></td>"
        f"<td>{clip}</td><td>{changes}</td><td>{bars}</td></tr>"
    )


def _bar(name: str, value: int) -> str:
    colour = _COLOURS[stat_colour(value)]
    return f'<div>{name} {value}<div class="bar"><span style="width:{value}%;background:{colour}"></span></div></div>'
