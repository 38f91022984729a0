#!/usr/bin/env bash
# make test: the fast tier (make check's tests), then the slow tier, each a pytest run in three processes (Makefile);
# then one line per tier (passed, failed, skipped, seconds), so a CI log ends with where the time went. Both tiers run even
# when the first fails: one run shows every failure. Exit 1 if either failed.
#   scripts/test_tiers.sh [pytest args...]      e.g. scripts/test_tiers.sh tests/bot -x
set -u
py=${PYTHON:-.venv/bin/python}
reports=${TIER_REPORTS:-out/tiers}
rm -rf "$reports" && mkdir -p "$reports"
failed=0
for tier in fast slow; do
  marker=$([ "$tier" = fast ] && echo "not slow" || echo "slow")
  "$py" -m pytest -m "$marker" --junitxml="$reports/$tier.xml" "$@"
  rc=$?
  # 5: nothing collected in this tier (a selection of fast tests only): not a failure.
  [ $rc -ne 0 ] && [ $rc -ne 5 ] && failed=1
done
"$py" scripts/tier_summary.py "$reports/fast.xml" "$reports/slow.xml"
exit $failed
