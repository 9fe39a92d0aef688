"""micro_batch_size: auto takes as many rows as the device's memory holds, and says so."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

import rlft.models.memory as memory


class _Model(torch.nn.Module):
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)


def test_the_token_budget_is_half_the_memory_left_after_the_model_states(monkeypatch):
    per_token = memory.activation_bytes_per_token(_Model.config, 2)
    assert 1e6 < per_token < 2e6  # SmolLM2-135M in bf16: about 1.4 MB a token
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 6 * 2**30)
    tokens, why = memory.activation_token_budget(
        _Model(), device=torch.device("cpu"), compute_bytes=2, resident_bytes=2 * 2**30
    )
    assert tokens == (2 * 2**30) // per_token and f"up to {tokens} tokens" in why and "of 6 GiB" in why
    # rows follow the batch's length: short rows, more of them; never zero, never more than the batch
    assert memory.rows_for(tokens, 64, 100) == min(64, tokens // 100)
    assert memory.rows_for(tokens, 64, 1000) == tokens // 1000 < memory.rows_for(tokens, 64, 100)
    assert memory.rows_for(tokens, 8, 10**7) == 1
    assert memory.rows_for(10**9, 8, 10) == 8


def test_the_auto_budget_is_logged_and_a_step_fits_in_one_pass(tiny_config):
    from rlft import Trainer

    tiny_config["algorithm"]["micro_batch_size"] = "auto"
    tiny_config["train"]["max_steps"] = 1
    tiny_config["eval"].update(before_training=False, after_training=False)
    trainer = Trainer(config=tiny_config)
    result = trainer.train()
    p = trainer.job.updater.p
    assert p.micro_batch_size == 32 and p.micro_batch_tokens > 10_000  # the tiny model's rows all fit
    assert "micro_batch_size auto: up to" in (result.run_dir / "train_log.log").read_text()


def test_checkpointed_activations_are_a_fraction_of_the_plain_ones():
    plain = memory.activation_bytes_per_token(_Model.config, 2)
    selective = memory.activation_bytes_per_token(_Model.config, 2, recompute="selective")
    checkpointed = memory.activation_bytes_per_token(_Model.config, 2, recompute="full")
    assert checkpointed < plain / 2  # the LM head rows are kept either way
    assert checkpointed < selective < 0.7 * plain


def test_auto_recomputes_selectively_on_a_gpu_and_everything_only_where_nothing_less_fits():
    everything_fits = lambda mode: True  # noqa: E731
    assert memory.auto_recompute("cuda", everything_fits) == "selective"
    assert memory.auto_recompute("cpu", everything_fits) == "off"
    assert memory.auto_recompute("cpu", lambda mode: mode != "off") == "selective"
    assert memory.auto_recompute("cuda", lambda mode: mode == "full") == "full"
    assert memory.auto_recompute("cpu", lambda mode: False) == "full"


def test_auto_checkpointing_turns_on_only_when_one_sequence_does_not_fit(tiny_config, monkeypatch):
    from rlft import Trainer
    from rlft.models.checkpointing import is_checkpointing

    tiny_config["train"]["max_steps"] = 1
    tiny_config["eval"].update(before_training=False, after_training=False)
    trainer = Trainer(config=tiny_config)
    trainer.train()
    assert not is_checkpointing(trainer.job.parts.model)  # plenty of memory: off

    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 0)  # nothing beyond the model states
    tiny_config["train"]["run_name"] = "tight"
    trainer = Trainer(config=tiny_config)
    result = trainer.train()
    assert is_checkpointing(trainer.job.parts.model)
    log = (result.run_dir / "train_log.log").read_text()
    assert "model.gradient_checkpointing auto: on, because one sequence of up to" in log
    assert result.steps == 1

    tiny_config["model"]["gradient_checkpointing"] = False
    tiny_config["train"]["run_name"] = "off"
    trainer = Trainer(config=tiny_config)
    trainer.setup()
    assert not is_checkpointing(trainer.job.parts.model)  # false means false


def test_a_cpu_pass_is_split_only_where_each_part_keeps_full_speed():
    full = memory.full_speed_tokens("cpu")
    assert full == 2048 and memory.full_speed_tokens("cuda") is None
    # a GPU pass is at full speed from 1e14 FLOPs of forward + backward: ~9.7k tokens of a 1.7B model,
    # ~123k of a 135M one, never under the CPU's 2048
    assert memory.full_speed_tokens("cuda", 1_711_376_384) == 9738
    assert memory.full_speed_tokens("cuda", 134_515_008) == 123_901
    assert memory.full_speed_tokens("cuda", 8 * 10**9) == 2083
    assert memory.full_speed_tokens("cuda", 10**11) == 2048
    # 16 rows of 40 + 256 tokens (two groups share their prompts): two passes of 8 rows
    assert memory.pass_tokens(10**6, 16, 16 * 296, 2 * 40 + 16 * 256, full) == 8 * 296
    # 16 rows of 40 + 32 tokens (592 computed): one pass, as without the rule
    assert memory.pass_tokens(10**6, 16, 16 * 72, 2 * 40 + 16 * 32, full) == 16 * 72
    # memory still rules where it needs more passes: the budget stays within it
    assert memory.pass_tokens(1000, 16, 16 * 296, 2 * 40 + 16 * 256, full) == 1000
    # rows are shared out evenly: 32 rows of 256 in three passes take 11 rows each, not 10 + 10 + 10 + 2
    assert memory.rows_for(memory.pass_tokens(10**6, 32, 32 * 256, 3 * 2048 + 100, full), 32, 256) == 11
    assert memory.pass_tokens(10**6, 16, 16 * 296, 2 * 40 + 16 * 256, None) == 16 * 296  # a GPU: one pass


def test_the_budget_counts_gradients_and_moments_for_trained_parameters_only():
    """Under LoRA the frozen weights have no gradient or AdamW state: counting them as trained left an 8B
    model on a 141 GB GPU a one-token budget (one row a pass, every layer recomputed)."""
    assert memory.resident_bytes(10**9, 10**9, reference=True) == 20 * 10**9
    assert memory.resident_bytes(10**9, 10**6, reference=False) == 4 * 10**9 + 12 * 10**6


def test_the_runs_budget_leaves_out_a_reward_model_beside_the_policy(
    tiny_config, tiny_model_dir, tmp_path, monkeypatch
):
    """A reward model on the run's device keeps its fp32 weights all run long: the update's activations get what is
    left after it, as the planner says (rlft.planner.scorers)."""
    from transformers import AutoModelForSequenceClassification

    from rlft import Trainer
    from rlft.models.loading import load_tokenizer

    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm.config.pad_token_id = load_tokenizer(tiny_model_dir).pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    load_tokenizer(tiny_model_dir).save_pretrained(tmp_path / "rm")
    rm_bytes = 4 * sum(p.numel() for p in rm.parameters())
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 64 * 2**20)
    tiny_config["algorithm"]["micro_batch_size"] = "auto"
    budgets = []
    spec = {"type": "model", "name": "rm", "path": str(tmp_path / "rm"), "dtype": "fp32"}
    for name, extra in (("plain", []), ("rm", [spec])):
        tiny_config["reward"]["functions"] += extra
        tiny_config["train"]["run_name"] = name
        trainer = Trainer(config=tiny_config)
        trainer.setup()
        budgets.append(trainer.job.updater.p.micro_batch_tokens)
    per_token = memory.activation_bytes_per_token(
        trainer.job.parts.model.config, 2 if trainer.job.parts.autocast_dtype else 4
    )
    assert abs((budgets[0] - budgets[1]) - rm_bytes / 2 / per_token) <= 1, (budgets, rm_bytes, per_token)
