"""The suite's file order: scripts/file_durations.py reads pytest's report, conftest puts long files first."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FILE_DURATIONS, load_script

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_script("file_durations")


def test_a_files_calls_setups_and_teardowns_add_up_and_reports_are_averaged():
    one = """============================= slowest durations ==============================
12.50s call     tests/a/test_x.py::test_one
2.00s setup    tests/a/test_x.py::test_one
1.00s call     tests/b/test_y.py::test_two[p]
0.50s teardown tests/a/test_x.py::test_two
1 passed in 16.00s"""
    two = "4.00s call     tests/b/test_y.py::test_two[q]\n"
    assert _script().file_seconds([one, two]) == {"tests/a/test_x.py": 7.5, "tests/b/test_y.py": 2.5}


def test_the_recorded_files_exist_and_the_longest_is_first():
    assert all((ROOT / f).is_file() for f in FILE_DURATIONS), [f for f in FILE_DURATIONS if not (ROOT / f).is_file()]
    seconds = list(FILE_DURATIONS.values())
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > 60
