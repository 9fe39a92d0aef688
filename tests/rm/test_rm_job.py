"""Reward-model training (kind: rm) on the tiny model: the Bradley-Terry loss by hand, accuracy rising
on separable pairs, a checkpoint that plain transformers loads with the same scores, exact resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlft import Trainer
from rlft.algorithms import bradley_terry_loss
from rlft.errors import DataError
from tests.conftest import assert_resume_is_bit_exact, read_jsonl, write_jsonl

WORDS = ["sun", "moon", "tree", "sea", "cat", "dog", "hill", "rain"]
HELD_OUT_WORDS = ["snow", "wind", "star", "road"]  # the eval pairs' topics: never in a training pair


def _pairs(n: int, words: list[str] = WORDS) -> list[dict]:
    """The chosen reply is polite ("please ... thank you"), the rejected one is not: separable. Every
    other rejected reply is the longer one, so length alone does not tell them apart."""
    out = []
    for i in range(n):
        w = words[i % len(words)]
        rude = f"{w}. whatever" if i % 2 == 0 else f"{w}. whatever, I do not care about the {w} or you at all."
        out.append(
            {"prompt": f"Tell me about the {w}.", "chosen": f"Please, the {w} is nice. Thank you!", "rejected": rude}
        )
    return out


@pytest.fixture
def rm_config(tmp_path, tiny_model_dir):
    train = write_jsonl(tmp_path / "prefs" / "train.jsonl", _pairs(24))
    evalf = write_jsonl(tmp_path / "prefs" / "eval.jsonl", _pairs(8, HELD_OUT_WORDS))
    return {
        "kind": "rm",
        "model": {"path": str(tiny_model_dir), "dtype": "fp32"},
        "data": {"train_file": str(train), "eval_file": str(evalf), "max_length": 256},
        "rm": {"learning_rate": 3e-3, "batch_size": 8, "micro_batch_size": 4, "lr_scheduler": "constant"},
        "train": {
            "epochs": 50,
            "max_steps": 12,
            "logging_interval": 1,
            "save_interval": 100,
            "output_dir": str(tmp_path / "outputs"),
            "run_name": "rm",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {},
    }


def test_bradley_terry_loss_matches_hand_computed_values():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    loss, stats = bradley_terry_loss(chosen, rejected)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2  # -log sigmoid(+1), -log sigmoid(-1)
    assert loss.item() == pytest.approx(expected, abs=1e-6) and loss.item() == pytest.approx(0.813262, abs=1e-6)
    assert stats.accuracy == 0.5 and stats.margin == 0.0 and stats.chosen == 1.0 and stats.rejected == 1.0
    with_margin, _ = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.5]), num_pairs=4)
    assert with_margin.item() == pytest.approx((math.log1p(math.exp(-0.5)) + math.log1p(math.exp(1.5))) / 4, abs=1e-6)
    centred, _ = bradley_terry_loss(chosen, rejected, center_coef=0.1)
    assert centred.item() == pytest.approx(expected + 0.1 * (9.0 + 1.0) / 2, abs=1e-6)
    # micro-batches add up to the batch: the same gradient for any split
    c, r = torch.randn(6, requires_grad=True), torch.randn(6)
    bradley_terry_loss(c, r)[0].backward()
    whole = c.grad.clone()
    c.grad = None
    for part in (slice(0, 2), slice(2, 6)):
        bradley_terry_loss(c[part], r[part], num_pairs=6)[0].backward()
    assert torch.allclose(c.grad, whole, atol=1e-7)


@pytest.mark.slow
def test_pairwise_accuracy_rises_and_the_checkpoint_loads_with_plain_transformers(rm_config):
    result = Trainer(config=rm_config).train()
    before, after = result.eval_before, result.eval_after
    assert after.accuracy == 1.0 and after.accuracy > before.accuracy, (before, after)
    assert after.margin > before.margin + 0.5
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 13)) and {"loss", "accuracy", "margin"} <= set(rows[0])
    assert rows[-1]["loss"] < rows[0]["loss"]
    evals = sorted((result.run_dir / "eval").glob("step-*.json"))
    assert json.loads(evals[-1].read_text())["accuracy"] == 1.0
    assert json.loads((result.run_dir / "run.json").read_text())["kind"] == "rm"

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    ckpt = result.final_checkpoint
    assert json.loads((ckpt / "config.json").read_text())["architectures"][0].endswith("ForSequenceClassification")
    plain = AutoModelForSequenceClassification.from_pretrained(str(ckpt)).eval()
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    from rlft.config.loader import load_config
    from rlft.models.reward_model import left_pad, load_reward_model, sequence_scores
    from rlft.preference.data import load_pairs

    cfg = load_config(data=rm_config)
    pairs = load_pairs(cfg.data, tok, "eval", 0).pairs[:3]
    ours = load_reward_model(ckpt, tok.pad_token_id, torch.device("cpu"))
    seqs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    with torch.no_grad():
        batched = sequence_scores(ours, *left_pad(seqs, tok.pad_token_id, torch.device("cpu")))
        alone = torch.stack([plain(input_ids=torch.tensor([s])).logits[0, 0] for s in seqs])
    assert torch.allclose(batched, alone, atol=1e-4), (batched, alone)
    assert (batched[:3] > batched[3:]).all()


def test_resume_is_bit_exact(rm_config):
    assert_resume_is_bit_exact(rm_config)


def test_a_bad_pair_names_file_and_line(rm_config, tmp_path):
    bad = write_jsonl(tmp_path / "prefs" / "bad.jsonl", _pairs(2) + [{"prompt": "x", "chosen": "a"}])
    rm_config["data"]["train_file"] = str(bad)
    with pytest.raises(DataError, match=r"bad\.jsonl.*line 3.*missing field 'rejected'"):
        Trainer(config=rm_config).setup()
    same = write_jsonl(tmp_path / "prefs" / "same.jsonl", [{"prompt": "x", "chosen": "a", "rejected": "a"}])
    rm_config["data"]["train_file"] = str(same)
    with pytest.raises(DataError, match="chosen and rejected are the same"):
        Trainer(config=rm_config).setup()


def test_model_reward_output_transforms_are_pinned_by_values():
    from rlft.rewards.model_reward import RunningStats, transform

    raw = torch.tensor([-2.0, 0.0, 3.0])
    assert transform(raw, "logit", None).tolist() == [-2.0, 0.0, 3.0]
    assert transform(raw, "logit", 1.5).tolist() == [-1.5, 0.0, 1.5]
    assert transform(raw, "sigmoid", None).tolist() == pytest.approx([0.1192029, 0.5, 0.9525741], abs=1e-6)
    stats = RunningStats()
    first = transform(raw, "standardized", None, stats)  # mean 1/3, sample std 2.5166
    assert first.tolist() == pytest.approx([-0.9272, -0.1325, 1.0596], abs=1e-4)
    second = transform(torch.tensor([1.0 / 3.0]), "standardized", None, stats)  # at the running mean: 0
    assert stats.count == 4 and second.tolist() == pytest.approx([0.0], abs=1e-6)
    assert transform(torch.tensor([100.0]), "standardized", 1.0, stats).tolist() == [1.0]  # 1.79 before the clip


@pytest.mark.parametrize("native", [True, False])
def test_a_reward_model_in_bf16_keeps_half_its_weights_and_scores_as_fp32_does_to_a_few_digits(
    native, tiny_model_dir, tmp_path, caplog, monkeypatch
):
    """``dtype: bf16``: its Linear weights stored in bf16 and a bf16 autocast forward, the embedding in fp32; the
    scores near fp32's. Where the CPU has no native bf16 it scores in fp32 and says so."""
    from transformers import AutoModelForSequenceClassification

    from rlft.models import precision
    from rlft.models.loading import load_tokenizer
    from rlft.rewards.model_reward import ModelRewardFunction

    if native and not precision.native_bf16(torch.device("cpu")):
        pytest.skip("this CPU has no native bf16")
    if not native:
        monkeypatch.setattr(precision, "native_bf16", lambda device: False)

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm.config.pad_token_id = load_tokenizer(tiny_model_dir).pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    load_tokenizer(tiny_model_dir).save_pretrained(tmp_path / "rm")
    prompts, completions = ["sun", "a b c", "moon"] * 2, ["yes", "no no", "the tree and the sea"] * 2
    scores, linears = {}, {}
    for dtype in ("fp32", "bf16"):
        scorer = ModelRewardFunction(dtype, str(tmp_path / "rm"), device="cpu", dtype=dtype, batch_size=4)
        scores[dtype] = scorer.raw_scores(prompts, completions)
        linears[dtype] = {m.weight.dtype for m in scorer.model.modules() if isinstance(m, torch.nn.Linear)}
        assert scorer.model.get_input_embeddings().weight.dtype == torch.float32
    assert linears["fp32"] == {torch.float32} and scores["fp32"].dtype == torch.float32
    if native:
        assert linears["bf16"] == {torch.bfloat16}
        assert not torch.equal(scores["bf16"], scores["fp32"])  # it did compute in bf16
        assert torch.allclose(scores["bf16"], scores["fp32"], atol=0.05 * scores["fp32"].abs().max().item())
    else:
        assert linears["bf16"] == {torch.float32} and torch.equal(scores["bf16"], scores["fp32"])
        assert "reward 'bf16': its dtype is bf16 but this CPU has no native bf16 matmul" in caplog.text


@pytest.mark.slow
def test_grpo_on_a_trained_reward_model_raises_its_score(rm_config, tiny_config, tmp_path, monkeypatch):
    """A reward model trained here becomes a type: model reward; GRPO against it logs raw and processed
    scores, loads it once, and the RM score of the completions rises."""
    rm_config["eval"].update(before_training=False, after_training=False)
    rm_config["train"]["max_steps"] = 12
    rm = Trainer(config=rm_config).train().final_checkpoint
    tiny_config["reward"] = {
        "functions": [{"type": "model", "name": "rm", "path": str(rm), "output": "logit", "clip": 20.0}]
    }
    tiny_config["train"].update(max_steps=12)
    tiny_config["algorithm"].update(max_new_tokens=8, learning_rate=5e-3)
    tiny_config["eval"].update(before_training=False, after_training=False)
    import rlft.models.reward_model as reward_model

    loads = []
    original = reward_model.load_reward_model
    monkeypatch.setattr(reward_model, "load_reward_model", lambda *a, **k: loads.append(a) or original(*a, **k))
    trainer = Trainer(config=tiny_config)
    result = trainer.train()
    rows = read_jsonl(result.run_dir / "metrics.jsonl")
    assert {"reward/rm/mean", "reward/rm/raw_mean", "reward/rm/raw_std"} <= set(rows[0])
    assert rows[0]["reward/rm/mean"] == pytest.approx(rows[0]["reward/rm/raw_mean"], abs=1e-4)  # logit: the raw score
    early = sum(r["reward/rm/mean"] for r in rows[:3]) / 3
    late = sum(r["reward/rm/mean"] for r in rows[-3:]) / 3
    assert late > early + 0.2, (early, late)  # -1.09 -> -0.62 on 2026-12-05: a rise, not noise
    assert len(loads) == 1  # loaded once for the whole run, never per step


def test_a_model_reward_must_name_a_reward_model(tiny_config, tiny_model_dir):
    from rlft.config.loader import load_config
    from rlft.errors import ConfigError, RewardError
    from rlft.rewards.manager import RewardManager

    tiny_config["reward"] = {"functions": [{"type": "model", "path": "nowhere/rm"}]}
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.path: not found: nowhere/rm.*reward-model folder"):
        load_config(data=tiny_config)
    tiny_config["reward"] = {"functions": [{"type": "model", "path": str(tiny_model_dir)}]}
    cfg = load_config(data=tiny_config)
    with pytest.raises(RewardError, match="is not a reward model.*rlft train-rm"):
        RewardManager.from_specs(cfg.reward.functions)


def test_conversation_layout_pairs(rm_config, tmp_path):
    """TRL's conversational layout (chosen/rejected as whole conversations, as Anthropic-HH converted)
    gives the same pairs as prompt + response strings."""
    from rlft.config.loader import load_config
    from rlft.models.loading import load_tokenizer
    from rlft.preference.data import load_pairs

    rows = _pairs(4)
    convs = [
        {
            "chosen": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["chosen"]}],
            "rejected": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["rejected"]}],
        }
        for r in rows
    ]
    rm_config["data"]["train_file"] = str(write_jsonl(tmp_path / "prefs" / "conv.jsonl", convs))
    cfg = load_config(data=rm_config)
    tok = load_tokenizer(cfg.model.path)
    as_conversations = load_pairs(cfg.data, tok, "train", 0).pairs
    rm_config["data"]["train_file"] = str(write_jsonl(tmp_path / "prefs" / "plain.jsonl", rows))
    as_strings = load_pairs(load_config(data=rm_config).data, tok, "train", 0).pairs
    assert [(p.chosen, p.rejected, p.prompt_len) for p in as_conversations] == [
        (p.chosen, p.rejected, p.prompt_len) for p in as_strings
    ]
    assert all(0 < p.prompt_len < min(len(p.chosen), len(p.rejected)) for p in as_strings)


def test_a_bf16_reward_model_checkpoint_loads_as_an_fp32_load_does(tiny_model_dir, tmp_path):
    """Read as stored (bf16) and widened on its device: the weights an fp32 load gives, bit for bit."""
    from transformers import AutoModelForSequenceClassification

    from rlft.models.reward_model import load_reward_model

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rm.to(torch.bfloat16).save_pretrained(tmp_path / "rm")
    fp32_load = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", num_labels=1, dtype=torch.float32)
    ours = load_reward_model(tmp_path / "rm", 0, torch.device("cpu"))
    assert {p.dtype for p in ours.parameters()} == {torch.float32} and ours.config.problem_type == "regression"
    for (name, p), q in zip(fp32_load.named_parameters(), ours.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert all(p.requires_grad for p in ours.parameters())  # trainable unless frozen for scoring
