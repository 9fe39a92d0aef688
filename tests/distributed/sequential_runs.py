"""Several ``rlft train`` runs one after another in each process of one torchrun launch.

The data-parallel tests need half a dozen 2-process runs; a launch of its own for each costs a
launcher and two processes of ~7 s of imports before the first step, most of what such a tiny run
costs. Each run here goes through ``rlft train``'s entry point (`rlft.cli.main.main`) as under
``python train.py``: it joins the process group, trains and leaves it, and the next run joins anew
(which is also how an API user runs several trainings in one process). Usage:

    torchrun --nproc_per_node=2 tests/distributed/sequential_runs.py RUNS.json

RUNS.json: a list of argument lists for ``rlft train``. The first run that fails ends the launch
with its exit status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlft.cli.main import main


def run_all(path: str) -> int:
    for args in json.loads(Path(path).read_text()):
        code = main(["train", *args])
        if code != 0:
            print(f"sequential_runs: `rlft train {' '.join(args)}` exited {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run_all(sys.argv[1]))
