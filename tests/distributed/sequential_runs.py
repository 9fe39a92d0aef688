"""Several ``rlft train`` runs one after another in each process of one torchrun launch.

The data-parallel tests need half a dozen 2-process runs; a launch of its own for each costs a
launcher and two processes of ~7 s of imports before the first step, most of what such a tiny run
costs. Each run here goes through ``rlft train``'s entry point (`rlft.cli.main.main`) as under
``python train.py``, except that the process group is joined once for the whole launch: leaving it
and joining a new one between runs races, since a process that rejoins first can read its peer's
address from the previous group in the launcher's store and wait on it for ever. Usage:

    torchrun --nproc_per_node=2 tests/distributed/sequential_runs.py RUNS.json

RUNS.json: a list of argument lists for ``rlft train``. The first run that fails ends the launch
with its exit status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from rlft.cli.main import main


def run_all(path: str) -> int:
    dist.init_process_group("gloo")  # rlft joins a group that exists instead of making one
    leave, dist.destroy_process_group = dist.destroy_process_group, lambda *args, **kwargs: None
    for args in json.loads(Path(path).read_text()):
        code = main(["train", *args])
        if code != 0:
            print(f"sequential_runs: `rlft train {' '.join(args)}` exited {code}", file=sys.stderr)
            return code
    dist.barrier()
    leave()
    return 0


if __name__ == "__main__":
    sys.exit(run_all(sys.argv[1]))
