"""Seconds each test file took, from pytest's ``--durations=0`` report, as the JSON that
``tests/conftest.py`` orders the files by (longest first, so that pytest-xdist starts them early):

    bash scripts/test.sh --durations=0 | tee run.log
    python scripts/file_durations.py run.log [more.log ...] > tests/file_durations.json

With several reports each file gets its mean. Setup and teardown count with the calls."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:call|setup|teardown)\s+(\S+?)::")


def file_seconds(reports: list[str]) -> dict[str, float]:
    """{test file: mean seconds over the reports}, longest first."""
    totals: dict[str, float] = defaultdict(float)
    for text in reports:
        for line in text.splitlines():
            if m := LINE.match(line):
                totals[m.group(2)] += float(m.group(1))
    return {f: round(s / len(reports), 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    paths = sys.argv[1:] or ["/dev/stdin"]
    print(json.dumps(file_seconds([open(p).read() for p in paths]), indent=1))
