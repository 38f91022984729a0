"""One line per test tier from pytest's JUnit report (xunit1, each test's ``tier`` property written by
tests/conftest.py): passed, failed, skipped and seconds of test time; then the run's own seconds.

python scripts/tier_summary.py out/tiers/tests.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TIERS = ("fast", "slow")


def lines(report: Path) -> list[str]:
    if not report.is_file():
        return [f"{report}: no report (the run did not finish)"]
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return [f"{report}: an empty report"]
    counts: dict[str, Counter[str]] = {tier: Counter() for tier in TIERS}
    seconds = dict.fromkeys(TIERS, 0.0)
    for case in suite.iter("testcase"):
        tier = next((p.get("value") for p in case.iter("property") if p.get("name") == "tier"), "fast")
        outcome = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else ("skipped" if case.find("skipped") is not None else "passed")
        )
        counts.setdefault(tier, Counter())[outcome] += 1
        seconds[tier] = seconds.get(tier, 0.0) + float(case.get("time", 0.0))
    said = [
        f"tier {tier}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
        f"{seconds[tier]:.0f} s of test time"
        for tier, c in counts.items()
    ]
    return [*said, f"all: {float(suite.get('time', 0.0)):.0f} s"]


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print("\n".join(lines(Path(path))))
