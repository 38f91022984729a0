"""One line per test tier from pytest's JUnit reports: passed, failed, skipped and seconds.

python scripts/tier_summary.py out/tiers/fast.xml out/tiers/slow.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def line(report: Path) -> str:
    tier = report.stem
    if not report.is_file():
        return f"tier {tier}: no report (the run did not finish)"
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return f"tier {tier}: an empty report"
    tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    seconds = float(suite.get("time", 0.0))
    return f"tier {tier}: {tests - failed - skipped} passed, {failed} failed, {skipped} skipped in {seconds:.0f} s"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(line(Path(path)))
