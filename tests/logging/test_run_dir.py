"""Where a new run's files go: never into another run's directory."""

from __future__ import annotations

import subprocess
import sys

from rlft.logging.run_dir import CLAIM, RunDirectory


def test_two_runs_starting_together_get_two_directories(tmp_path):
    """Neither has written a file yet (both are still loading their models): the second must not
    take the first one's directory."""
    first = RunDirectory.create(tmp_path, "exp", "grpo")
    second = RunDirectory.create(tmp_path, "exp", "grpo")
    assert first.root == tmp_path.resolve() / "exp"
    assert second.root == tmp_path.resolve() / "exp-2"


def test_a_directory_left_by_a_run_that_never_began_is_taken_over(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / CLAIM).write_text(ended.stdout.strip())
    assert RunDirectory.create(tmp_path, "exp", "grpo").root == tmp_path.resolve() / "exp"
