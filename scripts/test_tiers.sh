#!/usr/bin/env bash
# make test: every test, both tiers in one pytest run of three processes (Makefile), then one line per tier (passed,
# failed, skipped, seconds of test time), so a CI log ends with where the time went. One run rather than the fast tier
# then the slow one: each run's processes import the whole suite (torch, transformers, diffusers) as they collect,
# about 12 s of CPU each, and a run's last file leaves the other processes idle; on two cores both add up.
# Exit 1 if any test failed.
#   scripts/test_tiers.sh [pytest args...]      e.g. scripts/test_tiers.sh tests/bot -x
set -u
py=${PYTHON:-.venv/bin/python}
reports=${TIER_REPORTS:-out/tiers}
rm -rf "$reports" && mkdir -p "$reports"
# xunit1 keeps each test's properties, where tests/conftest.py writes its tier.
"$py" -m pytest -o junit_family=xunit1 --junitxml="$reports/tests.xml" "$@"
rc=$?
"$py" scripts/tier_summary.py "$reports/tests.xml"
# 5: nothing collected (a selection that matched no test): not a failure.
[ $rc -ne 0 ] && [ $rc -ne 5 ] && exit 1
exit 0
