"""A checkpoint that cannot be written (here: a full disk) stops the run with one clear message, no
traceback, and the checkpoints written before it intact."""

from __future__ import annotations

import shutil
from collections import namedtuple

import rlft.checkpoint.io as io
from rlft.checkpoint.io import is_complete
from tests.cli.test_cli import write_config


def test_a_full_disk_names_the_checkpoint_and_keeps_the_last_one(tmp_path, tiny_config, monkeypatch, capsys):
    from rlft.cli.main import main

    tiny_config["train"].update(max_steps=2, save_interval=1, run_name="full")
    tiny_config["eval"].update(before_training=False, after_training=False)
    config = write_config(tmp_path, tiny_config)
    real_save, saves = io.torch.save, {"n": 0}

    def save(obj, path, *args, **kwargs):
        if "checkpoint-2" in str(path):  # the second checkpoint's write hits a full disk
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 839062848")
        saves["n"] += 1
        return real_save(obj, path, *args, **kwargs)

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(io.torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - 5 * 2**20, 5 * 2**20))
    code = main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 1 and saves["n"] > 0
    assert "Traceback" not in err
    assert "could not write checkpoint checkpoint-2" in err and "the disk is full (5 MB free)" in err
    assert "The earlier checkpoints are intact (newest: checkpoint-1)" in err and "--resume" in err
    ckpts = tmp_path / "outputs" / "full" / "checkpoints"
    assert is_complete(ckpts / "checkpoint-1")
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-1"]  # no half-written folder left
