"""The policy update: skipping zero-advantage rows is exact; degenerate batches don't crash."""

from __future__ import annotations

import copy
import dataclasses

import torch

from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy
from rlft.rl.batch import UpdateBatch
from rlft.rl.update import PolicyUpdater, UpdateParams
from rlft.trainer.optim import build_optimizer, build_scheduler


def _updater(model, micro=3):
    opt = build_optimizer(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=0, schedule="constant", min_ratio=0.0)
    params = UpdateParams(
        loss_name="ppo_clip",
        loss_params={"clip_low": 0.2, "clip_high": 0.2},
        kl_estimator="k3",
        aggregation="token_mean",
        temperature=1.0,
        ppo_epochs=1,
        mini_batch_size=None,
        micro_batch_size=micro,
        max_grad_norm=1e9,
        max_len=4,
    )
    opt.register_step_pre_hook(_keep_step_grads)
    return PolicyUpdater(model, None, opt, sched, params, None)


def _keep_step_grads(optimizer, args, kwargs) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.step_grads = {p: p.grad.clone() for p in params if p.grad is not None}


def step_grads(up: PolicyUpdater) -> list[torch.Tensor]:
    """The gradients the last optimizer step used, in parameter order (clipped_step frees them after it)."""
    return [up.optimizer.step_grads[p] for p in up.model.parameters() if p in up.optimizer.step_grads]


def _batch(adv_per_row):
    g = torch.Generator().manual_seed(3)
    n = len(adv_per_row)
    mask = torch.ones(n, 4, dtype=torch.long)
    mask[::2, 3] = 0
    return UpdateBatch(
        prompt_ids=torch.randint(5, 60, (2, 5), generator=g),
        prompt_mask=torch.ones(2, 5, dtype=torch.long),
        row_prompt=torch.tensor([0] * (n // 2) + [1] * (n - n // 2)),
        completion_ids=torch.randint(5, 60, (n, 4), generator=g),
        completion_mask=mask,
        loss_mask=mask,
        advantages=torch.tensor(adv_per_row)[:, None] * mask,
    )


def _model(tiny_model_dir):
    return load_policy(
        ModelConfig(path=str(tiny_model_dir), dtype="fp32"), torch.device("cpu"), model_dir=tiny_model_dir
    )


def test_skipping_zero_advantage_rows_is_exact(tiny_model_dir):
    base = _model(tiny_model_dir)
    skip, full = copy.deepcopy(base), copy.deepcopy(base)
    batch = _batch([1.0, 0.0, -1.0, 0.0, 0.0, 0.5])
    up_skip, up_full = _updater(skip), _updater(full)
    up_full._rows_with_gradient = lambda b, rows, kl_coef: rows  # compute every row
    s1 = up_skip.update(batch, kl_coef=0.0)
    s2 = up_full.update(batch, kl_coef=0.0)
    assert s1["rows_in_update"] == 0.5 and s2["rows_in_update"] == 1.0
    assert abs(s1["grad_norm"] - s2["grad_norm"]) < 1e-5
    # Compare the gradients the step used (Adam would amplify float round-off in near-zero gradients).
    names = [name for name, _ in skip.named_parameters()]
    for name, a, b in zip(names, step_grads(up_skip), step_grads(up_full), strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4, msg=name)
    assert all(p.grad is None for p in skip.parameters())  # spent: freed after the step


def test_monitoring_means_average_over_the_computed_rows(tiny_model_dir):
    """On-policy, the ratio is 1 on every token: ratio/mean must read 1.0 when half the rows are skipped
    (it once read ~rows_in_update, 0.5, because it divided by the tokens of every row)."""
    up = _updater(_model(tiny_model_dir))
    stats = up.update(_batch([1.0, 0.0, -1.0, 0.0, 0.0, 0.5]), kl_coef=0.0)
    assert stats["rows_in_update"] == 0.5
    assert abs(stats["ratio/mean"] - 1.0) < 1e-6
    assert 0.0 <= stats["clip_frac"] <= 1.0


def test_all_zero_advantages_still_steps_without_error(tiny_model_dir):
    model = _model(tiny_model_dir)
    up = _updater(model)
    before = [p.detach().clone() for p in model.parameters()]
    stats = up.update(_batch([0.0] * 6), kl_coef=0.0)
    assert stats["rows_in_update"] == 0.0 and stats["grad_norm"] == 0.0
    # first Adam step with a zero gradient leaves the weights unchanged
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)


def test_update_moves_logprob_in_direction_of_advantage(tiny_model_dir):
    model = _model(tiny_model_dir)
    up = _updater(model, micro=2)
    batch = _batch([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    with torch.no_grad():
        before, _ = batch.logprobs(model, 1.0)
    up.update(batch, kl_coef=0.0)
    with torch.no_grad():
        after, _ = batch.logprobs(model, 1.0)
    delta = ((after - before) * batch.loss_mask).sum(-1)
    assert (delta[0::2] > 0).all() and (delta[1::2] < 0).all()


def test_multi_step_update_uses_rollout_logprobs_as_old(tiny_model_dir):
    base = _model(tiny_model_dir)
    batch = _batch([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    with torch.no_grad():
        sampled, _ = batch.logprobs(base, 1.0)
    runs = {}
    for name, rollout_lp in [("reused", sampled + 1e-7), ("recomputed", None)]:
        model = copy.deepcopy(base)
        up = _updater(model, micro=2)
        up.p = UpdateParams(**{**up.p.__dict__, "ppo_epochs": 2, "mini_batch_size": 3})
        calls = []
        up._logprobs_no_grad = lambda module, b, f=up._logprobs_no_grad, calls=calls: calls.append(1) or f(module, b)
        batch.rollout_logprobs, batch.old_logprobs = rollout_lp, None
        up.score(batch, kl_coef=0.0)
        runs[name] = (up.update(batch, kl_coef=0.0), model, len(calls))
    assert runs["reused"][2] == 0 and runs["recomputed"][2] == 1  # one forward pass fewer
    # 4 optimizer steps later the weights agree: the old log-probs were the same numbers
    for a, b in zip(runs["reused"][1].parameters(), runs["recomputed"][1].parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_token_budget_buckets_rows_by_length_and_covers_each_once():
    n = 8
    lengths = torch.tensor([2, 9, 3, 9, 1, 5, 9, 4])
    mask = (torch.arange(9)[None] < lengths[:, None]).long()
    batch = UpdateBatch(
        prompt_ids=torch.ones(2, 3, dtype=torch.long),
        prompt_mask=torch.ones(2, 3, dtype=torch.long),
        row_prompt=torch.tensor([0] * 4 + [1] * 4),
        completion_ids=mask.clone(),
        completion_mask=mask,
        loss_mask=mask,
    )
    everything = torch.arange(n)
    assert [c.tolist() for c in batch.micro_batches(3, None, everything)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # 30 tokens: the three 9-token rows (3 + 9 = 12 columns each) go two at a time; the short ones pack
    chunks = batch.micro_batches(n, 30, everything)
    assert [c.tolist() for c in chunks] == [[1, 3], [6, 5], [7, 2, 0, 4]]
    assert sorted(torch.cat(chunks).tolist()) == list(range(n))
    assert [c.tolist() for c in batch.micro_batches(2, 1000, everything)] == [[1, 3], [6, 5], [7, 2], [0, 4]]


def test_a_full_speed_size_splits_a_long_batch_in_even_passes_and_leaves_a_short_one_whole():
    def batch(length):
        mask = torch.ones(16, length, dtype=torch.long)
        return UpdateBatch(
            prompt_ids=torch.ones(2, 40, dtype=torch.long),
            prompt_mask=torch.ones(2, 40, dtype=torch.long),
            row_prompt=torch.arange(2).repeat_interleave(8),
            completion_ids=mask.clone(),
            completion_mask=mask,
            loss_mask=mask,
        )

    long = batch(256).micro_batches(16, 10**6, full_speed=2048)
    assert [len(c) for c in long] == [8, 8] and sorted(torch.cat(long).tolist()) == list(range(16))
    assert all(len(batch(256).rows(c).prompt_ids) * 40 + len(c) * 256 >= 2048 for c in long)
    assert [len(c) for c in batch(32).micro_batches(16, 10**6, full_speed=2048)] == [16]
    assert [len(c) for c in batch(256).micro_batches(16, 10**6)] == [16]  # no full-speed size: one pass


def test_length_bucketed_micro_batches_give_the_one_pass_update(tiny_model_dir):
    base = _model(tiny_model_dir)
    results = []
    for tokens in (None, 20):  # one pass over all 6 rows; a budget that splits them by length
        model = copy.deepcopy(base)
        updater = _updater(model, micro=6)
        updater.p = dataclasses.replace(updater.p, micro_batch_tokens=tokens)
        batch = _batch([1.0, -0.5, 0.25, 2.0, -1.0, 0.5])
        assert len(batch.micro_batches(6, tokens)) == (1 if tokens is None else 3)
        updater.update(batch, kl_coef=0.0)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-4)  # Adam at lr 1e-2: summation order
