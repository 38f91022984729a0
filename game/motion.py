"""Motion level -> the decoder's ``flow`` input (the motion scope the clip should have).

The table is the release's inference_Decoder.py, which reads the ML state token; its Gradio
app passes SC instead and uses another table, a bug this project does not copy.
"""

from __future__ import annotations

FLOW_BY_MOTION_LEVEL: dict[int, float] = {1: 0.5, 2: 2.5, 3: 10.0, 4: 15.0}
FLOW_OTHERWISE = 40.0  # every other level, 5 and all zero or negative ones included


def flow_for(motion_level: int) -> float:
    return FLOW_BY_MOTION_LEVEL.get(motion_level, FLOW_OTHERWISE)
