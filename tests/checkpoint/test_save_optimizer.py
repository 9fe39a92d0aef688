"""train.save_optimizer: false writes export-only checkpoints, which --resume refuses clearly."""

from __future__ import annotations

import pytest

from rlft.errors import UsageError


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_export_only_checkpoints_are_smaller_and_cannot_be_resumed(tiny_config):
    from rlft import Trainer

    tiny_config["train"].update(max_steps=1)
    tiny_config["eval"].update(before_training=False, after_training=False)
    full = Trainer(config=tiny_config).train().final_checkpoint
    tiny_config["train"].update(save_optimizer=False, run_name="export-only")
    slim = Trainer(config=tiny_config).train().final_checkpoint
    assert (full / "optimizer.pt").is_file() and not (slim / "optimizer.pt").exists()
    assert (slim / "model.safetensors").is_file()
    assert _dir_bytes(slim) < _dir_bytes(full) - (full / "optimizer.pt").stat().st_size * 0.9
    tiny_config["train"]["max_steps"] = 2
    with pytest.raises(UsageError, match="no optimizer state .*train.save_optimizer: false.*model.path"):
        Trainer(config=tiny_config, resume_from=str(slim)).train()
    with pytest.raises(UsageError, match="train.save_optimizer: false"):
        Trainer(config=tiny_config, resume_from="auto").train()
