"""micro_batch_size: auto takes as many rows as the device's memory holds, and says so."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

import rlft.models.memory as memory


class _Model(torch.nn.Module):
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)


def test_auto_micro_batch_fills_the_budget_and_never_exceeds_the_batch(monkeypatch):
    per_token = memory.activation_bytes_per_token(_Model.config, 2)
    assert 1e6 < per_token < 2e6  # SmolLM2-135M in bf16: about 1.4 MB a token
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 64 * 2**30)
    size, why = memory.auto_micro_batch(_Model(), rows=16, seq_len=128, device=torch.device("cpu"),
                                        compute_bytes=2, resident_bytes=2 * 2**30)
    assert size == 16 and "16 of 16 rows" in why
    # a small device: half of what is left after the model states, at the longest sequence
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 4 * 2**30)
    size, why = memory.auto_micro_batch(_Model(), rows=64, seq_len=256, device=torch.device("cpu"),
                                        compute_bytes=2, resident_bytes=2 * 2**30)
    assert size == (2**30) // (per_token * 256) and 1 < size < 64
    assert f"{size} of 64 rows" in why and "256 tokens" in why
    # never zero, even when one row is over budget
    size, _ = memory.auto_micro_batch(_Model(), rows=8, seq_len=10**6, device=torch.device("cpu"),
                                      compute_bytes=4, resident_bytes=0)
    assert size == 1


def test_the_auto_choice_is_logged_and_used(tiny_config):
    from rlft import Trainer

    tiny_config["algorithm"]["micro_batch_size"] = "auto"
    tiny_config["train"]["max_steps"] = 1
    tiny_config["eval"].update(before_training=False, after_training=False)
    trainer = Trainer(config=tiny_config)
    result = trainer.train()
    assert trainer.job.updater.p.micro_batch_size == 32  # 4 prompts x 8: the tiny model fits whole
    assert "micro_batch_size auto: 32 of 32 rows" in (result.run_dir / "train_log.log").read_text()
