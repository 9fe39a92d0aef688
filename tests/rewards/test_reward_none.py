"""A reward that returns None for a sample does not apply to it (TRL's convention)."""

from __future__ import annotations

import logging
import math

import httpx
import pytest
import torch
from pydantic import TypeAdapter

from rlft.config.rewards import RewardConfig
from rlft.config.schema import RewardSpec
from rlft.errors import RewardError
from rlft.rewards.manager import RewardManager
from rlft.rewards.remote import _scores

SPEC = TypeAdapter(RewardSpec)

REWARDS = """
def code_only(completions, kind, **kw):
    # applies to the code rows only, as a TRL reward for one kind of task does
    return [float(len(c)) if k == "code" else None for c, k in zip(completions, kind)]

def nothing(completions, **kw):
    return [None] * len(completions)

def everything(completions, **kw):
    return [1.0] * len(completions)
"""


def manager(tmp_path, *weighted):
    path = tmp_path / "mixed_rewards.py"
    path.write_text(REWARDS, encoding="utf-8")
    return RewardManager.from_specs(
        [
            SPEC.validate_python({"type": "custom", "function": f"{path}:{name}", "weight": weight})
            for name, weight in weighted
        ]
    )


def test_a_none_adds_nothing_to_the_total_and_is_left_out_of_the_mean(tmp_path):
    m = manager(tmp_path, ("code_only", 0.5), ("everything", 2.0))
    kinds = ["code", "math"] * 4
    comps = ["a", "bb", "ccc", "dddd", "e", "ff", "ggg", "hhhh"]
    res = m.score([""] * 8, comps, {"kind": kinds})
    expected = [0.5 * len(c) + 2.0 if k == "code" else 2.0 for c, k in zip(comps, kinds)]
    assert res.total.tolist() == pytest.approx(expected)
    code = res.per_reward["code_only"]
    assert code.isnan().tolist() == [k == "math" for k in kinds]  # NaN marks "does not apply"
    assert code.nanmean().item() == pytest.approx((1 + 3 + 1 + 3) / 4)  # over the 4 rows it applies to
    assert res.per_reward["everything"].tolist() == [1.0] * 8
    assert res.extra["reward/code_only/applied"] == 0.5
    assert "reward/everything/applied" not in res.extra


def test_the_applied_share_is_logged_on_every_step_once_a_reward_has_skipped(tmp_path):
    m = manager(tmp_path, ("code_only", 1.0), ("everything", 1.0))
    assert "reward/code_only/applied" not in m.score(["", ""], ["a", "b"], {"kind": ["code", "code"]}).extra
    assert m.score(["", ""], ["a", "b"], {"kind": ["math", "code"]}).extra["reward/code_only/applied"] == 0.5
    assert m.score(["", ""], ["a", "b"], {"kind": ["code", "code"]}).extra["reward/code_only/applied"] == 1.0


def test_a_sample_no_reward_applies_to_gets_zero_and_one_warning(tmp_path, caplog):
    m = manager(tmp_path, ("code_only", 1.0), ("nothing", 3.0))
    with caplog.at_level(logging.WARNING, logger="rlft"):
        res = m.score(["", "", ""], ["a", "bb", "ccc"], {"kind": ["code", "math", "math"]})
        m.score([""], ["x"], {"kind": ["math"]})
    assert res.total.tolist() == [1.0, 0.0, 0.0]
    assert all(math.isfinite(v) for v in res.total.tolist())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "no reward applies to sample 1 of 3 (every reward returned None: code_only, "
        "nothing); its total reward is 0. 2 such samples in this batch"
    )
    assert "'bb'" in warnings[0]


def test_nan_is_still_an_error(tmp_path):
    path = tmp_path / "nan_reward.py"
    path.write_text("def r(completions, **kw):\n    return [None, float('nan')]\n", encoding="utf-8")
    m = RewardManager.from_specs([SPEC.validate_python({"type": "custom", "function": f"{path}:r"})])
    with pytest.raises(RewardError, match=r"reward 'r' returned a non-finite value \(nan\) for sample 1 of 2"):
        m.score(["", ""], ["a", "b"], {})


def test_a_scoring_service_may_answer_null():
    response = httpx.Response(200, json={"rewards": [0.5, None]})
    assert _scores("reward 'remote'", response, 2) == [0.5, None]


def test_the_reward_server_answers_null_where_a_reward_does_not_apply(tmp_path):
    from fastapi.testclient import TestClient

    from rlft.rewards.server import create_reward_app

    path = tmp_path / "mixed_rewards.py"
    path.write_text(REWARDS, encoding="utf-8")
    cfg = RewardConfig(
        functions=[
            {"type": "custom", "function": f"{path}:code_only"},
            {"type": "custom", "function": f"{path}:everything"},
        ]
    )
    answer = TestClient(create_reward_app(cfg)).post(
        "/score", json={"prompts": ["", ""], "completions": ["abc", "d"], "columns": {"kind": ["code", "math"]}}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"rewards": [4.0, 1.0], "per_reward": {"code_only": [3.0, None], "everything": [1.0, 1.0]}}
    assert torch.tensor([3.0, float("nan")]).nanmean().item() == 3.0


def test_step_metrics_and_evaluation_average_a_reward_over_the_samples_it_applies_to(tmp_path):
    """metrics.jsonl's reward/<name>/mean and eval/step-N.json's per-reward means stay finite (and the
    report valid JSON) when a reward skips samples."""
    import json

    from rlft.evaluation import evaluate
    from rlft.rl.metrics import rollout_metrics
    from tests.evaluation.test_evaluator import ScriptedEngine, _examples

    m = manager(tmp_path, ("code_only", 1.0), ("everything", 1.0))
    res = m.score([""] * 4, ["a", "bbb", "cc", "d"], {"kind": ["code", "math", "code", "math"]})
    metrics = rollout_metrics(
        res.total,
        res.per_reward,
        torch.tensor([1, 3, 2, 1]),
        ["stop"] * 4,
        2,
        weights={"code_only": 1.0, "everything": 1.0},
    )
    assert metrics["reward/code_only/mean"] == pytest.approx(1.5) and metrics["reward/everything/mean"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())

    skip_p1 = manager(tmp_path, ("code_only", 1.0), ("everything", 1.0))
    examples = [
        type(ex)(prompt=ex.prompt, text=ex.text, columns={"kind": "math" if i == 1 else "code"}, source=ex.source)
        for i, ex in enumerate(_examples())
    ]
    result = evaluate(
        ScriptedEngine(),
        examples,
        skip_p1,
        max_new_tokens=8,
        batch_size=8,
        accuracy_reward="code_only",
        success_threshold=1.0,
    )
    assert result.rewards["code_only"] == pytest.approx((1 + 7) / 2)  # "x" and "x x x x", not p1's "y"
    assert result.samples[1]["rewards"]["code_only"] is None and not result.samples[1]["correct"]
    json.loads(json.dumps(result.samples, allow_nan=False))
