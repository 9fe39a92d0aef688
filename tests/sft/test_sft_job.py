"""SFT end to end on the tiny ChatML model: the loss falls, the run directory is complete, resume is
exact, the checkpoint is a valid model.path for RL, and kinds are kept apart."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from rlft import Trainer
from rlft.errors import ConfigError
from tests.conftest import read_jsonl

TIMING = {"step_seconds", "tokens_per_s", "peak_mem_mb"}


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING and not k.startswith("resources/")} for r in rows]


@pytest.mark.slow
def test_sft_lowers_held_out_loss_and_writes_the_run(sft_config):
    sft_config["train"].update(max_steps=12, save_interval=6)
    sft_config["reward"] = {"functions": [{"type": "tool_call", "name": "well_formed"}]}
    result = Trainer(config=sft_config).train()
    before, after = result.eval_before, result.eval_after
    assert after.loss < before.loss - 0.5, (before.loss, after.loss)
    assert before.generation is not None and after.accuracy is not None  # rewards given: generation eval
    run = result.run_dir
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert {"loss", "grad_norm", "lr", "trained_tokens", "tokens", "examples", "tokens_per_s"} <= set(rows[0])
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-12", "checkpoint-6"]
    ck = result.final_checkpoint
    template = (ck / "chat_template.jinja").read_text()
    assert "<tool_call>" in template  # the checkpoint carries the template it was trained with
    evaluation = json.loads((run / "eval" / "step-12.json").read_text())
    assert evaluation["eval_loss"] == after.loss and evaluation["samples"][0]["prompt"][-1]["role"] == "tool"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["kind"] == "sft"
    log = (run / "train_log.log").read_text()
    order = [
        log.index(s)
        for s in [
            "config loaded",
            "model loaded",
            "chat template: hermes",
            "data loaded",
            "sft: 16 examples",
            "step 1/12",
            "held-out loss: before",
        ]
    ]
    assert order == sorted(order)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_sft_resume_is_bit_exact(sft_config, lora, monkeypatch):
    """A run killed after its step-2 checkpoint and resumed equals an uninterrupted one, bit for bit
    (the cosine schedule, the data position and dropout's random stream included)."""
    from rlft.sft.job import SFTJob

    if lora:
        sft_config["model"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.1}
    sft_config["eval"]["before_training"] = False
    sft_config["train"].update(max_steps=4, save_interval=2)
    straight = copy.deepcopy(sft_config)
    straight["train"]["run_name"] = "straight"
    a = Trainer(config=straight).train()

    killed = copy.deepcopy(sft_config)
    killed["train"]["run_name"] = "resumed"
    step = SFTJob.train_step

    def crash_at_3(job, n):
        if n == 3:
            raise KeyboardInterrupt
        return step(job, n)

    monkeypatch.setattr(SFTJob, "train_step", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        Trainer(config=killed).train()
    monkeypatch.undo()
    b2 = Trainer(config=killed, resume_from="auto").train()
    rows = read_jsonl(b2.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert _strip(rows) == _strip(read_jsonl(a.run_dir / "metrics.jsonl"))
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    wa, wb = load_file(str(a.final_checkpoint / name)), load_file(str(b2.final_checkpoint / name))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_refuses_a_change_that_breaks_the_sft_state(sft_config):
    from rlft.errors import UsageError

    sft_config["train"].update(max_steps=1, save_interval=1)
    sft_config["eval"].update(before_training=False, after_training=False)
    first = Trainer(config=copy.deepcopy(sft_config)).train()
    sft_config["sft"]["batch_size"] = 2
    with pytest.raises(UsageError, match="sft.batch_size: 4 -> 2 \\(the position in the data order"):
        Trainer(config=sft_config, resume_from=first.final_checkpoint).setup()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_an_sft_checkpoint_is_the_model_path_of_an_rl_run(sft_config, tiny_config, lora):
    from rlft.models.save import load_for_inference

    if lora:
        sft_config["model"]["lora"] = {"r": 4, "alpha": 8}
    sft_config["train"]["max_steps"] = 2
    sft_config["eval"].update(before_training=False, after_training=False)
    sft = Trainer(config=sft_config).train()
    tiny_config["model"] = {"path": str(sft.final_checkpoint), "dtype": "fp32"}
    if lora:  # a fresh adapter on top of the merged SFT weights
        tiny_config["model"]["lora"] = {"r": 4, "alpha": 8}
    tiny_config["train"].update(max_steps=2, run_name="rl-after-sft")
    tiny_config["eval"].update(before_training=False)
    rl = Trainer(config=tiny_config).train()
    assert [r["step"] for r in read_jsonl(rl.run_dir / "metrics.jsonl")] == [1, 2]

    # The RL run started from the SFT'd weights (the adapter merged in), not from the SFT run's start.
    started_from = json.loads((rl.final_checkpoint / "trainer_state.json").read_text())["model_dir"]
    assert ("merged-" in started_from) if lora else started_from == str(sft.final_checkpoint)
    start, _ = load_for_inference(started_from)
    sft_model, _ = load_for_inference(sft.final_checkpoint, merge=True)
    base, _ = load_for_inference(sft_config["model"]["path"])
    weights = [dict(m.named_parameters())["model.layers.0.self_attn.q_proj.weight"] for m in (start, sft_model, base)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
    assert "<tool_call>" in (rl.final_checkpoint / "chat_template.jinja").read_text()  # and kept its template


def test_each_command_runs_its_own_kind(sft_config, tiny_config, tmp_path):
    import yaml

    from rlft.cli.main import main

    sft_file = tmp_path / "sft.yaml"
    sft_file.write_text(yaml.safe_dump(sft_config))
    rl_file = tmp_path / "rl.yaml"
    rl_file.write_text(yaml.safe_dump(tiny_config))
    with pytest.raises(ConfigError, match="kind: this config describes a sft run .*run it with `rlft sft --config"):
        Trainer(str(sft_file), kind="rl")
    assert main(["train", "--config", str(sft_file)]) == 2
    with pytest.raises(ConfigError) as info:
        Trainer(str(rl_file), kind="sft")
    problems = "\n".join(info.value.problems)
    assert "'algorithm' section belongs to rl configs (rlft train)" in problems


def test_reward_is_only_required_where_it_is_used(sft_config, tiny_config):
    from rlft.config.loader import load_config

    assert load_config(data=sft_config).reward is None  # SFT: optional
    del tiny_config["reward"]
    with pytest.raises(ConfigError, match="reward: required"):
        load_config(data=tiny_config)
    sft_config["eval"]["accuracy_reward"] = "correct"
    with pytest.raises(ConfigError, match="eval.accuracy_reward: there are no rewards"):
        load_config(data=sft_config)


def test_rlft_eval_compares_checkpoints_on_an_sft_config(sft_config, tmp_path):
    import yaml

    from rlft.cli.main import main

    sft_config["train"]["max_steps"] = 2
    sft_config["eval"].update(before_training=False, after_training=False, max_new_tokens=8)
    sft_config["reward"] = {"functions": [{"type": "tool_call", "name": "well_formed"}]}
    ck = Trainer(config=copy.deepcopy(sft_config)).train().final_checkpoint
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump(sft_config))
    out = tmp_path / "report"
    assert main(["eval", "--config", str(config), "--base", "--checkpoint", str(ck), "--out", str(out)]) == 0
    base = json.loads((out / "base.json").read_text())
    assert base["config_kind"] == "sft" and base["num_prompts"] == 4
    assert base["samples"][0]["prompt"][-1]["role"] == "tool"  # the conversation up to its last assistant turn
    assert (out / ck.name).with_suffix(".json").is_file() and (out / "report.md").is_file()
    del sft_config["reward"]
    config.write_text(yaml.safe_dump(sft_config))
    assert main(["eval", "--config", str(config), "--base"]) == 2  # nothing to score generations with


def test_a_template_that_does_not_preserve_prefixes_is_refused_at_start_up(sft_config, tmp_path):
    template = tmp_path / "rewriting.jinja"  # drops earlier assistant turns' reasoning, as some templates do
    template.write_text(
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "<think>a</think>A1"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "A2"},
            ]
        }
    ] * 4
    from tests.conftest import write_jsonl

    sft_config["data"].update(
        train_file=str(write_jsonl(tmp_path / "think.jsonl", rows)), eval_file=None, chat_template=str(template)
    )
    trainer = Trainer(config=sft_config)
    with pytest.raises(ConfigError, match="data.chat_template: the chat template does not preserve prefixes"):
        trainer.train()
    assert json.loads((trainer.run_dir.run_info).read_text())["status"] == "failed"
