"""A setting that is the slow choice for the model and hardware gets one warning line, and only then."""

from __future__ import annotations

from rlft import Trainer
from rlft.models.precision import cpu_has_native_bf16


def _log(trainer) -> str:
    trainer.setup()
    return (trainer.run_dir.root / "train_log.log").read_text()


def test_slow_settings_are_named(tiny_config):
    tiny_config["rollout"] = {"fused_decode": False, "decode_copy": False}
    tiny_config["model"]["gradient_checkpointing"] = True
    log = _log(Trainer(config=tiny_config))
    assert "rollout.fused_decode is false: this model could decode with rlft's fused decode" in log
    assert "model.gradient_checkpointing is true, but one sequence of up to" in log
    assert ("rollout.decode_copy is false under bf16" in log) == cpu_has_native_bf16()


def test_the_defaults_are_quiet(tiny_config):
    log = _log(Trainer(config=tiny_config))
    for phrase in (
        "rollout.fused_decode is false",
        "rollout.decode_copy is false",
        "gradient_checkpointing is true",
        "gradient_checkpointing auto: on",
        "train.native_kernels",
    ):
        assert phrase not in log
    from rlft.speed.kernels.build import compiler

    assert ("native CPU kernels (" in log) == (compiler() is not None)


def test_native_kernels_that_do_not_build_are_named_with_the_reason(tiny_config, monkeypatch, tmp_path):
    import rlft.speed.kernels as kernels

    monkeypatch.setattr(kernels, "_STATE", {})
    monkeypatch.setenv("RLFT_CACHE_DIR", str(tmp_path / "cache"))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    log = _log(Trainer(config=tiny_config))
    assert "train.native_kernels: not available here (C compiler" in log
    assert "the decode step, sampling and the softmaxes of the LM head and attention run as PyTorch ops" in log


def test_a_fixed_micro_batch_is_named_only_when_its_passes_are_too_small_for_full_speed(tiny_config):
    tiny_config["algorithm"]["micro_batch_size"] = 2  # 2 rows of ~16 tokens a pass, far below a full-speed pass
    assert "algorithm.micro_batch_size 2 splits each update into 16 forward/backward passes" in _log(
        Trainer(config=tiny_config)
    )
    # passes of 8 rows x 300 tokens are at full speed on a CPU already: splitting them costs nothing
    tiny_config["algorithm"].update(micro_batch_size=8, max_new_tokens=300)
    tiny_config["train"]["run_name"] = "long"
    assert "splits each update" not in _log(Trainer(config=tiny_config))
