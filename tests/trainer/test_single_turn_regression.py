"""Single-turn RL gives the same metrics as the code before the loss/attention mask split.

The code of :data:`BASELINE` (the last commit before the split) is taken out of this repository's
own history with ``git archive`` and run in a subprocess next to the current code, on the same
machine and config, so the comparison holds on any CPU. Every metric must be equal except
wall-clock timings and the two monitoring means that the same issue corrected on purpose
(``ratio/mean`` and ``clip_frac`` are now averaged over the rows actually computed) -- equal to a
relative 1e-4 in fp32, not bit for bit, since the LM head now runs only on the trained positions (a
matmul of another shape rounds differently; multi-turn episodes made it worth it).

When a later change alters single-turn numerics *on purpose*, move :data:`BASELINE` to the last
commit before it and say so in that commit's message. Moved to 27f0f2c, the first working commit with
counter-based sampling (each completion's draws a function of the seed, the data position and
its global row, so data-parallel processes sample what one process does): the sampled tokens
differ from the old random stream's by design. The comparison with the pre-split code held until
then.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import forked
from tests.conftest import read_jsonl

BASELINE = "27f0f2c4f4edcdcff0b424cfb9a9713a741f2df0"
REPO = Path(__file__).resolve().parents[2]
NOT_COMPARED = {
    "step_seconds",
    "generation_seconds",
    "update_seconds",
    "tokens_per_s",
    "peak_mem_mb",
    "ratio/mean",
    "clip_frac",
}

RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import rlft
assert rlft.__file__.startswith(sys.argv[1]), rlft.__file__
from rlft import Trainer
print(Trainer(config=json.load(open(sys.argv[2]))).train().run_dir)
"""


def _baseline_source(tmp_path: Path) -> Path:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the baseline commit's code is not available")
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{BASELINE}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"baseline commit {BASELINE[:7]} is not in this clone's history (shallow clone?)")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", BASELINE, "src"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # the "data" filter came in Python 3.11.4 (and 3.12); this archive is the repository's own history
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "baseline", **safe)
    return tmp_path / "baseline" / "src"


def _run(src: Path, config: dict, path: Path) -> list[dict]:
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = forked.run([sys.executable, "-c", RUN, str(src), str(path)], env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    # time/* and work/* (the per-phase accounting), resources/* and answers/* (health metrics) came after the baseline
    later = ("time/", "work/", "resources/", "answers/")
    return [
        {k: v for k, v in r.items() if k not in NOT_COMPARED and not k.startswith(later)}
        for r in read_jsonl(run_dir / "metrics.jsonl")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_single_turn_metrics_equal_the_pre_split_code(tiny_config, tmp_path, algorithm):
    baseline_src = _baseline_source(tmp_path)
    tiny_config["eval"].update(before_training=False, after_training=False)
    tiny_config["model"]["dtype"] = "fp32"  # bf16 rounding would drown the comparison
    if algorithm == "ppo":  # KL in the reward, a critic, GAE over token rewards
        tiny_config["algorithm"].update(name="ppo", critic={"learning_rate": 1e-3})
    runs = {}
    for label, src in (("baseline", baseline_src), ("current", REPO / "src")):
        config = json.loads(json.dumps(tiny_config))
        config["train"]["run_name"] = label
        runs[label] = _run(src, config, tmp_path / f"{label}.json")
    assert [r["step"] for r in runs["current"]] == [r["step"] for r in runs["baseline"]] == [1, 2, 3, 4]
    for now, then in zip(runs["current"], runs["baseline"]):
        assert now.keys() == then.keys()
        assert now == pytest.approx(then, rel=1e-4, abs=1e-7), {k: (now[k], then[k]) for k in now if now[k] != then[k]}
