"""Completions the machinery ended (tool timeout, crashed environment, reward outage) are left out of
their group's baseline and out of the loss, and counted; ``exclude_machinery_failures: false`` restores
the old behaviour."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from rlft.errors import EnvironmentFailure, RewardError, RewardOutage
from rlft.rl.advantage import AdvantageStage
from rlft.rl.batch import UpdateBatch
from rlft.rl.exclusion import ExclusionPolicy, exclude_rows
from rlft.rollout.base import RolloutBatch

G, T = 8, 4
REWARDS = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 0.25, 1.0, 0.75])
FINISHES = ["answered"] * 3 + ["tool_timeout"] + ["answered"] * 4


def _batch(n: int = G) -> UpdateBatch:
    mask = torch.ones(n, T, dtype=torch.long)
    ones = torch.ones(n, 2, dtype=torch.long)
    rollout = RolloutBatch(
        prompt_ids=ones,
        prompt_mask=ones,
        completion_ids=torch.full((n, T), 5),
        completion_mask=mask,
        texts=[""] * n,
        finish_reasons=["stop"] * n,
        prompt_index=[0] * n,
        loss_mask=mask.clone(),
    )
    return UpdateBatch.from_rollout(rollout)


def _stage(name: str, n: int = G) -> AdvantageStage:
    return AdvantageStage(name, n, "k3", kl_in_reward=False, params={"scale_rewards": True})


def _step(name: str, enabled: bool, finishes=FINISHES, failed=None):
    """The job's order: assess, zero the loss mask, advantages. Returns (batch, exclusion)."""
    excluded = ExclusionPolicy(enabled, logging.getLogger("test")).assess(finishes, failed)
    batch = _batch()
    exclude_rows(batch, excluded.valid)
    _stage(name).apply(REWARDS, batch, 0.0, excluded.valid)
    return batch, excluded


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_one_tool_timeout_leaves_the_others_advantages_as_in_a_group_of_seven(name):
    batch, excluded = _step(name, enabled=True)
    others = [i for i in range(G) if i != 3]
    alone = _batch(G - 1)
    _stage(name, G - 1).apply(REWARDS[others], alone, 0.0)
    torch.testing.assert_close(batch.advantages[others], alone.advantages, rtol=1e-5, atol=1e-6)
    assert torch.equal(batch.advantages[3], torch.zeros(T)) and int(batch.loss_mask[3].sum()) == 0
    assert int(batch.loss_mask[others].sum()) == (G - 1) * T
    assert excluded.metrics == {
        "excluded/tool_timeout": 1.0,
        "excluded/env_error": 0.0,
        "excluded/reward_outage": 0.0,
        "excluded/total": 1.0,
    }


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_turned_off_the_failed_row_counts_as_before(name):
    batch, excluded = _step(name, enabled=False)
    plain = _batch()
    _stage(name).apply(REWARDS, plain, 0.0)
    assert excluded.valid is None and torch.equal(batch.advantages, plain.advantages)
    assert batch.advantages[3].abs().sum() > 0 and int(batch.loss_mask.sum()) == G * T
    assert excluded.metrics["machinery_failures/tool_timeout"] == 1.0 and "excluded/total" not in excluded.metrics


def test_reasons_are_counted_once_per_row():
    finishes = ["env_error", "tool_timeout", "answered", "answered"]
    failed = torch.tensor([True, False, True, False])
    excluded = ExclusionPolicy(True, logging.getLogger("test")).assess(finishes, failed)
    assert excluded.valid.tolist() == [False, False, False, True]
    assert excluded.metrics == {
        "excluded/tool_timeout": 1.0,
        "excluded/env_error": 1.0,
        "excluded/reward_outage": 2.0,
        "excluded/total": 3.0,
    }


def test_a_batch_with_every_row_excluded_is_skipped_then_stops_the_run(caplog):
    policy = ExclusionPolicy(True, logging.getLogger("rlft.test"), patience=2)
    batch, excluded = _step("grpo", True, FINISHES, torch.ones(G, dtype=torch.bool))
    assert int(batch.loss_mask.sum()) == 0 and torch.equal(batch.advantages, torch.zeros(G, T))
    with caplog.at_level(logging.WARNING):
        assert policy.anything_left(1, 0.0, excluded.metrics) is False
    assert "update is skipped" in caplog.text and "8 reward_outage" in caplog.text
    assert policy.anything_left(2, 3.0, excluded.metrics) is True  # a step with rows resets the count
    assert policy.anything_left(3, 0.0, excluded.metrics) is False
    with pytest.raises(RewardOutage, match="2 steps in a row"):
        policy.anything_left(4, 0.0, excluded.metrics)
    with pytest.raises(EnvironmentFailure):
        for step in range(2):
            policy.anything_left(5 + step, 0.0, {"excluded/tool_timeout": 8.0})


def test_the_policy_loss_ignores_an_excluded_row():
    """The per-token objective of the update over the rows: an excluded row adds exactly nothing."""
    from rlft.algorithms import policy_objective

    batch, _ = _step("grpo", True)
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(G, T, generator=g, requires_grad=True)
    old = lp.detach() + 0.1 * torch.randn(G, T, generator=g)
    out = policy_objective(
        lp,
        old,
        batch.advantages,
        batch.loss_mask,
        None,
        loss_name="ppo_clip",
        loss_params={},
        kl_coef=0.0,
        kl_estimator="k3",
        aggregation="token_mean",
        num_tokens=float(batch.loss_mask.sum()),
        num_seqs=float(G),
        max_len=T,
    )
    out.loss.backward()
    assert torch.equal(lp.grad[3], torch.zeros(T)) and lp.grad[[0, 1, 2]].abs().sum() > 0


# ------------------------------------------------------------------ an HTTP reward that goes down


class _Down(BaseHTTPRequestHandler):
    """Answers 503 to the requests whose number is in ``down`` (counting from 0), else scores by length."""

    down: set = set()
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append(body)
        failing = len(self.seen) - 1 in self.down
        scores = [float(len(c) % 3) for c in body["completions"]]
        payload = "unavailable" if failing else json.dumps({"rewards": scores})
        self.send_response(503 if failing else 200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def down_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Down)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def use(*down):
        _Down.down, _Down.seen = set(down), []
        return f"http://127.0.0.1:{server.server_address[1]}/score"

    yield use
    server.shutdown()


def _http_manager(url, **kw):
    from rlft.config.rewards import HttpReward as HttpSpec
    from rlft.rewards.manager import RewardManager

    return RewardManager.from_specs(
        [HttpSpec(type="http", url=url, name="served", retries=0, backoff=0.0, max_concurrency=1, **kw)]
    )


def test_an_outage_marks_only_the_samples_it_lost(down_server):
    manager = _http_manager(down_server(1), batch_size=2)
    out = manager.score(["p"] * 6, ["a", "bb", "ccc", "d", "ee", "fff"], tolerate_outages=True)
    assert out.failed.tolist() == [False, False, True, True, False, False]
    assert out.per_reward["served"][2:4].isnan().all() and out.total.tolist()[:2] == [1.0, 2.0]
    with pytest.raises(RewardOutage, match="answered 503 after 1 attempts"):
        _http_manager(down_server(0)).score(["p"] * 2, ["a", "b"])  # not tolerated: the run stops, as before
    assert _http_manager(down_server()).score(["p"], ["a"], tolerate_outages=True).failed.tolist() == [False]


def test_a_wrong_answer_is_still_an_error_when_outages_are_tolerated(down_server):
    from rlft.rewards.remote import HttpReward

    url = down_server()
    fn = HttpReward("served", url, retries=0)
    fn._http.post = lambda *a, **k: __import__("httpx").Response(200, text="<html>")  # a bug, not an outage
    with pytest.raises(RewardError, match="not JSON") as info:
        fn(["p"], ["a"])
    assert not isinstance(info.value, RewardOutage)


def test_a_run_goes_on_through_a_reward_outage_and_counts_it(down_server, tiny_config):
    """Step 1's second request (of two) answers 503: its 16 samples are excluded and the run goes on;
    turned off, the same outage stops the run."""
    from rlft import Trainer
    from tests.conftest import read_jsonl

    tiny_config["reward"]["functions"].append(
        {
            "type": "http",
            "url": down_server(1),
            "name": "served",
            "retries": 0,
            "backoff": 0.0,
            "batch_size": 16,
            "max_concurrency": 1,
        }
    )
    tiny_config["train"].update(max_steps=2, samples_per_log=1000)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["excluded/reward_outage"] == 16.0 and rows[0]["excluded/total"] == 16.0
    assert rows[1]["excluded/total"] == 0.0
    samples = read_jsonl(result.run_dir / "samples.jsonl")  # every row: the lost ones say so
    lost = [r for r in samples if r.get("excluded")]
    assert len(lost) == 16 and {r["step"] for r in lost} == {1}
    assert all(r["rewards"]["served"] is None for r in lost)
    assert not any(r.get("excluded") for r in samples if r["step"] == 2)
    tiny_config["algorithm"]["exclude_machinery_failures"] = False
    tiny_config["reward"]["functions"][-1]["url"] = down_server(1)
    tiny_config["train"]["run_name"] = "off"
    with pytest.raises(RewardError, match="503"):
        Trainer(config=tiny_config).train()
    assert Path(tiny_config["train"]["output_dir"]).exists()


def test_a_judge_endpoint_outage_leaves_its_samples_out(down_server):
    from rlft.config.rewards import JudgeReward
    from rlft.rewards.manager import RewardManager

    manager = RewardManager.from_specs([JudgeReward(type="judge", url=down_server(0, 1, 2), retries=0, name="judge")])
    out = manager.score(["p", "q"], ["a", "b"], tolerate_outages=True)
    assert out.failed.tolist() == [True, True] and out.per_reward["judge"].isnan().all()
    with pytest.raises(RewardOutage, match="judge at"):
        manager.score(["p"], ["a"])


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"])
def test_an_excluded_row_leaves_the_update_as_without_it(tiny_model_dir, aggregation):
    """Same gradients as the batch without the row, also for a per-sequence mean (it is no sequence)."""
    import copy
    import dataclasses

    from tests.rl.test_update import _batch as update_batch
    from tests.rl.test_update import _model, _updater, step_grads

    base = _model(tiny_model_dir)
    batch = update_batch([1.0, -0.5, -1.0, 0.25, 0.0, 0.5])
    keep = torch.tensor([True, False, True, True, True, True])
    kept = torch.arange(6)[keep]
    alone = dataclasses.replace(
        batch,
        row_prompt=batch.row_prompt[kept],
        completion_ids=batch.completion_ids[kept],
        completion_mask=batch.completion_mask[kept],
        loss_mask=batch.loss_mask[kept],
        advantages=batch.advantages[kept],
    )
    exclude_rows(batch, keep)
    grads = []
    for b in (batch, alone):
        model = copy.deepcopy(base)
        up = _updater(model)
        up.p = dataclasses.replace(up.p, aggregation=aggregation)
        up.update(b, kl_coef=0.0)
        grads.append(step_grads(up))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_an_in_step_filler_pass_over_an_excluded_row_adds_nothing(tiny_model_dir, monkeypatch):
    """fsdp2 ranks with fewer micro-batches than the others run extra passes over one row with the loss
    times 0; that row may be an excluded one (no loss tokens), which must neither crash nor count."""
    import copy
    import dataclasses

    from rlft.distributed.strategy import Strategy
    from tests.rl.test_update import _batch as update_batch
    from tests.rl.test_update import _model, _updater, step_grads

    base = _model(tiny_model_dir)
    grads = []
    for extra in (0, 2):
        monkeypatch.setattr(Strategy, "micro_batch_rounds", lambda self, n, dist, extra=extra: n + extra)
        batch = update_batch([0.3, 1.0, -1.0, 0.25, 0.0, 0.5])
        exclude_rows(batch, torch.tensor([False, True, True, True, True, True]))
        model = copy.deepcopy(base)
        up = _updater(model)
        up.p = dataclasses.replace(up.p, aggregation="seq_mean_token_mean")
        up.update(batch, kl_coef=0.0)
        grads.append(step_grads(up))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


def test_filler_passes_over_a_share_with_every_row_excluded_give_a_zero_gradient(tiny_model_dir, monkeypatch):
    import dataclasses

    from rlft.distributed.strategy import Strategy
    from tests.rl.test_update import _batch as update_batch
    from tests.rl.test_update import _model, _updater, step_grads

    monkeypatch.setattr(Strategy, "micro_batch_rounds", lambda self, n, dist: n + 2)
    batch = update_batch([0.3, 1.0, -1.0, 0.25, 0.0, 0.5])
    batch.ref_logprobs = torch.full(batch.loss_mask.shape, -200.0)  # would overflow a KL term on these tokens
    exclude_rows(batch, torch.zeros(6, dtype=torch.bool))
    model = _model(tiny_model_dir)
    up = _updater(model)
    up.p = dataclasses.replace(up.p, kl_in_loss=True)
    up.update(batch, kl_coef=0.1)
    grads = step_grads(up)
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads)


class _Ex:
    def __init__(self, i):
        self.prompt, self.columns = f"p{i}", {}


class _Engine:
    """Two prompts x 4 completions; row 3 (of the first group) ended by a tool timeout."""

    def run(self, examples, sampling):
        n = len(examples) * sampling.n
        ids = torch.ones(n, 2, dtype=torch.long)
        finishes = ["answered"] * n
        finishes[3] = "tool_timeout"
        texts = ["a", "a", "a", "b"] + ["a", "b", "a", "b"]
        return RolloutBatch(ids, ids, ids, ids, texts[:n], finishes, [i // sampling.n for i in range(n)])


def test_dynamic_sampling_drops_a_group_whose_counted_rows_tie():
    """Group 0's rewards differ only on its timed-out row: with exclusion it has no signal and is dropped."""
    from rlft.data.sampler import PromptSampler
    from rlft.rewards.manager import RewardManager
    from rlft.rewards.specs import NamedReward
    from rlft.rl.collect import CollectParams, RolloutCollector
    from rlft.rollout import SamplingParams

    rewards = RewardManager(
        [NamedReward("is_b", lambda prompts, completions, **_: [float(c == "b") for c in completions])]
    )
    data = type("Data", (), {"examples": [_Ex(0), _Ex(1)]})()
    kept = {}
    for on in (True, False):
        params = CollectParams(
            SamplingParams(max_new_tokens=4, n=4), 2, dynamic_sampling=True, max_rounds=1, exclude_machinery_failures=on
        )
        out = RolloutCollector(_Engine(), rewards, data, PromptSampler(2, 2, seed=0, shuffle=False), params).collect()
        kept[on] = out.stats["dynamic_sampling/kept_groups"]
    assert kept == {True: 1.0, False: 2.0}


def test_a_step_with_every_sample_lost_skips_its_update_and_the_run_goes_on(down_server, tiny_config, capfd):
    from rlft import Trainer
    from tests.conftest import read_jsonl

    tiny_config["reward"]["functions"] = [
        {"type": "http", "url": down_server(0), "name": "served", "retries": 0, "backoff": 0.0}
    ]
    tiny_config["train"].update(max_steps=2)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["excluded/reward_outage"] for r in rows] == [32.0, 0.0]
    assert "loss" not in rows[0] and "loss" in rows[1]
    assert (
        "step 1: every completion was ended or left unscored by the machinery (32 reward_outage); the update "
        "is skipped" in capfd.readouterr().err
    )


def test_the_counts_are_logged_from_the_first_failure_on():
    """A run the machinery never failed logs the metrics it always did (tests/trainer's regression test)."""
    import logging

    from rlft.rl.exclusion import ExclusionPolicy

    policy = ExclusionPolicy(True, logging.getLogger("test"))
    keys = ["excluded/tool_timeout", "excluded/total"]
    quiet = {"reward/mean": 1.0, "excluded/tool_timeout": 0.0, "excluded/total": 0.0}
    policy.report(quiet, keys)
    assert quiet == {"reward/mean": 1.0}
    failed = {"excluded/tool_timeout": 2.0, "excluded/total": 2.0}
    policy.report(failed, keys)
    assert failed == {"excluded/tool_timeout": 2.0, "excluded/total": 2.0}
    after = {"excluded/tool_timeout": 0.0, "excluded/total": 0.0}
    policy.report(after, keys)
    assert after == {"excluded/tool_timeout": 0.0, "excluded/total": 0.0}  # kept: a gap would read as missing data


def test_reward_statistics_count_only_the_rows_the_policy_answered():
    """A row the machinery ended has no reward of the policy's: reward/mean, reward/std, the tied-group
    share and the per-reward means leave it out, as if the batch had been the other rows only."""
    from rlft.rl.metrics import rollout_metrics

    total = torch.tensor([1.0, 0.0, 0.0, 0.0])  # groups of two: [1, 0] and [0, 0 (lost)]
    per = {"correct": total.clone()}
    valid = torch.tensor([True, True, True, False])
    m = rollout_metrics(
        total, per, torch.tensor([2, 2, 2, 9]), ["stop", "stop", "stop", "tool_timeout"], 2, valid=valid
    )
    assert m["reward/mean"] == pytest.approx(1 / 3) and m["reward/correct/mean"] == pytest.approx(1 / 3)
    assert m["reward/std"] == pytest.approx(torch.tensor([1.0, 0.0, 0.0]).std().item())
    assert m["groups_zero_std"] == 0.5  # [1, 0] differs; the second group's one counted row is tied
    assert m["completion_len/mean"] == pytest.approx(15 / 4)  # lengths still count every row
    unmarked = rollout_metrics(total, per, torch.tensor([2, 2, 2, 9]), ["stop"] * 4, 2)
    assert unmarked["reward/mean"] == 0.25 and unmarked["groups_zero_std"] == 0.5
