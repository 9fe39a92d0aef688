"""Truncated importance sampling in the policy update and a training run, on CPU with the native engine:
the trainer computes its own old log-probs when it is on, and the mismatch metrics reach metrics.jsonl."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.conftest import read_jsonl
from tests.rl.test_update import _batch, _model, _updater


def _with_rollout_logprobs(batch, shift: float):
    """The batch with engine log-probs ``shift`` away from the model's (a known mismatch)."""
    batch.rollout_logprobs = torch.full(batch.loss_mask.shape, -2.0) * batch.loss_mask + shift
    return batch


def test_fp32_reuses_the_engines_logprobs_unless_tis_is_on(tiny_model_dir):
    model = _model(tiny_model_dir)
    batch = _with_rollout_logprobs(_batch([1.0, -1.0, 0.5, 0.0]), 0.0)
    plain = _updater(model)
    assert torch.equal(plain._old_logprobs(batch), batch.rollout_logprobs)
    tis = _updater(model)
    tis.p.loss_params["tis_cap"] = 2.0
    own = tis._old_logprobs(batch)
    assert not torch.allclose(own, batch.rollout_logprobs)
    torch.testing.assert_close(own, plain._logprobs_no_grad(model, batch))


@pytest.mark.parametrize("micro", [1, 3])
def test_an_update_with_tis_reports_the_mismatch_and_clip_fraction(tiny_model_dir, micro):
    model = _model(tiny_model_dir)
    batch = _batch([1.0, -1.0, 0.5, 0.3, -0.2, 1.0])
    with torch.no_grad():
        own = _updater(model)._logprobs_no_grad(model, batch)
    batch.rollout_logprobs = (own - math.log(3.0)) * batch.loss_mask  # pi_old / mu = 3 on every token
    up = _updater(copy.deepcopy(model), micro=micro)
    up.p.loss_params["tis_cap"] = 2.0
    stats = up.update(batch, kl_coef=0.0)
    assert stats["rollout/logprob_mismatch"] == pytest.approx(math.log(3.0), rel=1e-4)
    assert stats["rollout/tis_clip_frac"] == pytest.approx(1.0)
    off = _updater(copy.deepcopy(model), micro=micro).update(batch, kl_coef=0.0)
    assert "rollout/tis_clip_frac" not in off and off["rollout/logprob_mismatch"] == pytest.approx(
        math.log(3.0), rel=1e-4
    )
    assert stats["pg_loss"] == pytest.approx(2.0 * off["pg_loss"], rel=1e-4)  # every weight capped at 2


@pytest.mark.slow
def test_a_bf16_run_with_tis_logs_the_engine_trainer_gap(tiny_config):
    """The native engine decodes in bf16 with other kernels than the full forward: a small, real gap."""
    from rlft import Trainer

    cfg = copy.deepcopy(tiny_config)
    cfg["algorithm"].update(tis_cap=2.0)
    cfg["eval"].update(before_training=False, after_training=False)
    cfg["train"].update(max_steps=2)
    rows = read_jsonl(Trainer(config=cfg).train().run_dir / "metrics.jsonl")
    assert len(rows) == 2
    for row in rows:
        assert 0.0 < row["rollout/logprob_mismatch"] < 0.5
        assert 0.0 <= row["rollout/tis_clip_frac"] <= 1.0
