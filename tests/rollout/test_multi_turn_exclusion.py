"""Episodes the machinery ended -- a tool that always times out, an environment worker that dies --
finish as ``tool_timeout`` / ``env_error`` and are left out of the step and counted, while their
groups' other episodes keep the advantages they would have alone. On the tiny ChatML model, with
scripted turns (:class:`tests.rollout.test_multi_turn.ScriptedRunner`)."""

from __future__ import annotations

import logging

import torch

from rlft.envs.spec import EnvironmentSpec
from rlft.envs.tools import schemas_of
from rlft.rl.advantage import AdvantageStage
from rlft.rl.batch import UpdateBatch
from rlft.rl.exclusion import ExclusionPolicy, exclude_rows
from rlft.rl.metrics import episode_metrics
from rlft.rollout.base import SamplingParams
from tests.rollout.envs_for_tests import DyingEnv
from tests.rollout.test_multi_turn import call, examples, make_runner

G = 4
# Per episode (2 groups of 4): row 1 calls a tool that never returns, row 6 one that kills its worker.
SCRIPTS = {
    0: ["It is 2."],
    1: [call("hang", x="1"), "never"],
    2: [call("add", a=1, b=1), "2."],
    3: ["two"],
    4: ["3"],
    5: [call("add", a=1, b=2), "It is 3."],
    6: [call("die", x="1"), "never"],
    7: ["three"],
}
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.25])


def _rollout(engine):
    spec = EnvironmentSpec("DyingEnv", DyingEnv, {}, [], [])
    spec.schemas = schemas_of(DyingEnv, [])
    runner = make_runner(engine, SCRIPTS, spec=spec, tool_timeout=1.0)
    return runner.run(examples(engine, 2), SamplingParams(max_new_tokens=120, n=G))


def test_timed_out_and_crashed_episodes_are_excluded_and_counted(engine):
    rollout = _rollout(engine)
    finishes = rollout.finish_reasons
    assert finishes[1] == "tool_timeout" and finishes[6] == "env_error", finishes
    assert "worker died" in rollout.columns["trajectories"][6][-1]["content"]
    assert episode_metrics(rollout.episodes)["episode/finish/env_error"] == 1 / 8
    excluded = ExclusionPolicy(True, logging.getLogger("test")).assess(rollout.finish_reasons, None)
    assert excluded.metrics == {
        "excluded/tool_timeout": 1.0,
        "excluded/env_error": 1.0,
        "excluded/reward_outage": 0.0,
        "excluded/total": 2.0,
    }
    batch = UpdateBatch.from_rollout(rollout)
    assert int(batch.loss_mask[1].sum()) > 0 and int(batch.loss_mask[6].sum()) > 0  # the model's own tokens
    exclude_rows(batch, excluded.valid)
    AdvantageStage("grpo", G, "k3", kl_in_reward=False).apply(REWARDS, batch, 0.0, excluded.valid)
    for row in (1, 6):
        assert int(batch.loss_mask[row].sum()) == 0 and not batch.advantages[row].any()
    for group, failed in ((0, 1), (1, 6)):
        others = [i for i in range(group * G, (group + 1) * G) if i != failed]
        r = REWARDS[others]
        expected = (r - r.mean()) / (r.std() + 1e-4)
        got = batch.advantages[others].sum(-1) / batch.loss_mask[others].sum(-1)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_turned_off_the_failed_episodes_are_trained_on(engine):
    rollout = _rollout(engine)
    excluded = ExclusionPolicy(False, logging.getLogger("test")).assess(rollout.finish_reasons, None)
    assert excluded.valid is None
    assert excluded.metrics["machinery_failures/tool_timeout"] == 1.0
    assert excluded.metrics["machinery_failures/env_error"] == 1.0
    batch = UpdateBatch.from_rollout(rollout)
    exclude_rows(batch, excluded.valid)
    AdvantageStage("grpo", G, "k3", kl_in_reward=False).apply(REWARDS, batch, 0.0, excluded.valid)
    assert int(batch.loss_mask[1].sum()) > 0 and batch.advantages[1].any() and batch.advantages[6].any()
