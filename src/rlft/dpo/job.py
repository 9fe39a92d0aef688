"""The DPO job (``kind: dpo``, ``rlft dpo``): the policy learns from preference pairs directly,
against a frozen reference (the starting model; for LoRA the base weights with the adapter off).

Each pair's prompt is run once for both responses: the shared tokens are the prompt of
:func:`rlft.models.logprobs.grouped_completion_logprobs` (the forward RL's update uses), chosen and
rejected its two completions. The reference's log-probs are computed once per micro-batch, without
gradients. Checkpoints are causal-LM folders (a valid ``model.path`` for RL); evaluation reports the
held-out reward accuracy (the share of pairs whose implicit reward prefers the chosen response) and
the mean margin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from rlft.algorithms import dpo_loss
from rlft.config.schema import JOB_KINDS, DPOConfig
from rlft.data.prompts import log_loaded
from rlft.data.sampler import PromptSampler
from rlft.errors import DataError
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory
from rlft.models.logprobs import grouped_completion_logprobs
from rlft.models.precision import autocast
from rlft.preference.data import PreferencePair, load_pairs
from rlft.trainer.generation import GenerationSettings
from rlft.trainer.job import EvalRecord, TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.optim import build_optimizer, build_scheduler, clipped_step
from rlft.trainer.parts import build_model


@dataclass
class DPOEvalResult:
    accuracy: float
    margin: float
    loss: float
    num_pairs: int
    seconds: float

    def metrics_line(self) -> str:
        return (f"reward accuracy {self.accuracy:.1%}, margin {self.margin:+.4f}, loss {self.loss:.4f} "
                f"on {self.num_pairs} pairs")

    def summary(self) -> dict:
        return {"accuracy": self.accuracy, "margin": self.margin, "loss": self.loss, "num_pairs": self.num_pairs,
                "seconds": self.seconds}


def _batch(pairs: list[PreferencePair], pad_id: int, device: torch.device):
    """Shared prompts [b, P] (left-padded) and the 2b completions [2b, T] (right-padded): the b chosen
    responses, then the b rejected ones; row_prompt [2b] points each at its pair's prompt."""
    from rlft.models.reward_model import left_pad

    prompt_ids, prompt_mask = left_pad([p.chosen[: p.prompt_len] for p in pairs], pad_id, device)
    suffixes = [p.chosen[p.prompt_len:] for p in pairs] + [p.rejected[p.prompt_len:] for p in pairs]
    width = max(len(s) for s in suffixes)
    ids = torch.full((len(suffixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(suffixes), width), dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    row_prompt = torch.arange(len(pairs), device=device).repeat(2)
    return prompt_ids, prompt_mask, row_prompt, ids.to(device), mask.to(device)


class DPOJob:
    """One DPO job."""

    CONTINUITY = JOB_KINDS["dpo"].continuity

    def __init__(self, cfg: DPOConfig):
        self.cfg = cfg
        self._last = float("nan")

    def build(self, run_dir: RunDirectory) -> None:
        cfg, d = self.cfg, self.cfg.dpo
        self.log = get_logger()
        self.parts = build_model(cfg.model, with_reference=True)
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        tok = self.parts.tokenizer
        self.pad_id = tok.pad_token_id
        self.train_set = load_pairs(cfg.data, tok, "train", cfg.train.seed)
        self.eval_set = load_pairs(cfg.data, tok, "eval", cfg.train.seed)
        for pairs in (self.train_set, self.eval_set):
            for p in pairs.pairs if pairs is not None else []:
                if p.prompt_len == 0 or p.prompt_len in (len(p.chosen), len(p.rejected)):
                    raise DataError(f"{p.source}: DPO needs a shared prompt and two non-empty, different "
                                    f"responses; this pair's token sequences share {p.prompt_len} tokens")
        log_loaded(self.log, self.train_set, self.eval_set, "pairs")
        self.sampler = PromptSampler(len(self.train_set.pairs), d.batch_size, seed=cfg.train.seed,
                                     shuffle=cfg.data.shuffle)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        params = [p for p in self.parts.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, lr=d.learning_rate, weight_decay=d.weight_decay,
                                         betas=tuple(d.adam_betas), eps=d.adam_eps)
        self.scheduler = build_scheduler(self.optimizer, total_steps=self.total_steps, warmup_steps=d.warmup_steps,
                                         schedule=d.lr_scheduler, min_ratio=d.min_lr_ratio)

    def describe(self) -> list[str]:
        d = self.cfg.dpo
        return [f"dpo: {len(self.train_set.pairs)} preference pairs, {d.loss} loss, beta {d.beta}",
                "dpo parameters in effect: " + ", ".join(f"{k}={v}" for k, v in d.model_dump().items()),
                f"training for {self.total_steps} steps: {d.batch_size} pairs per step ({d.micro_batch_size} per "
                f"forward/backward), {self.steps_per_epoch} steps per epoch"]

    # ------------------------------------------------------------------ one step

    def _sequence_logprobs(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed response log-probs [b] of chosen and of rejected under ``model``."""
        prompt_ids, prompt_mask, row_prompt, ids, mask = batch
        with autocast(self.parts.autocast_dtype, self.device):
            lp, _ = grouped_completion_logprobs(model, prompt_ids, prompt_mask, row_prompt, ids, mask, loss_mask=mask)
        sums = (lp * mask).sum(-1)
        b = len(sums) // 2
        return sums[:b], sums[b:]

    def _loss(self, pairs: list[PreferencePair], num_pairs: float):
        batch = _batch(pairs, self.pad_id, self.device)
        with self.parts.reference.context() as ref:
            ref_c, ref_r = self._sequence_logprobs(ref, batch)
        pol_c, pol_r = self._sequence_logprobs(self.parts.model, batch)
        d = self.cfg.dpo
        return dpo_loss(pol_c, pol_r, ref_c, ref_r, beta=d.beta, loss=d.loss, label_smoothing=d.label_smoothing,
                        num_pairs=num_pairs)

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pairs = [self.train_set.pairs[i] for i in self.sampler.next_batch()]
        model, d = self.parts.model, self.cfg.dpo
        model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = 0.0, []
        for i in range(0, len(pairs), d.micro_batch_size):
            chunk = pairs[i : i + d.micro_batch_size]
            loss, s = self._loss(chunk, float(len(pairs)))
            loss.backward()
            loss_sum += float(loss.detach())
            stats.append((len(chunk), s))
        params = [p for p in model.parameters() if p.requires_grad]
        grad = clipped_step(self.optimizer, self.scheduler, params, d.max_grad_norm)
        if "skipped_updates" in grad:
            self.log.warning(f"step {step}: non-finite gradient norm ({grad['grad_norm']}); optimizer step skipped")
        n = sum(k for k, _ in stats)

        def mean(attr: str) -> float:
            return sum(k * getattr(s, attr) for k, s in stats) / n

        self._last = mean("accuracy")
        return {"loss": loss_sum, "rewards/accuracy": mean("accuracy"), "rewards/margin": mean("margin"),
                "rewards/chosen": mean("chosen"), "rewards/rejected": mean("rejected"), **grad, "lr": lr,
                "pairs": float(n), "step_seconds": time.perf_counter() - t0,
                "peak_mem_mb": peak_memory_mb(self.device)}

    def step_line(self, step: int, m: dict[str, float]) -> str:
        return (f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | reward accuracy {m['rewards/accuracy']:.1%} "
                f"| margin {m['rewards/margin']:+.4f} | grad norm {m['grad_norm']:.3f} | lr {m['lr']:.2e} | "
                f"{m['step_seconds']:.2f} s/step")

    def progress_info(self) -> str:
        return f"acc {self._last:.0%}"

    # ------------------------------------------------------------------ eval / state

    @torch.no_grad()
    def evaluate_pairs(self, pairs: list[PreferencePair]) -> DPOEvalResult:
        start = time.perf_counter()
        model = self.parts.model
        was_training = model.training
        model.eval()
        correct = margin = loss = 0.0
        try:
            for i in range(0, len(pairs), self.cfg.dpo.micro_batch_size):
                chunk = pairs[i : i + self.cfg.dpo.micro_batch_size]
                value, s = self._loss(chunk, 1.0)
                loss, correct, margin = loss + float(value), correct + s.accuracy * len(chunk), margin + s.margin * len(chunk)
        finally:
            model.train(was_training)
        n = len(pairs)
        return DPOEvalResult(correct / n, margin / n, loss / n, n, time.perf_counter() - start)

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        result = self.evaluate_pairs(self.eval_set.pairs)
        return EvalRecord(result, f"{result.metrics_line()} ({result.seconds:.0f}s)", result.summary())

    @staticmethod
    def eval_prompts(cfg: DPOConfig, tokenizer) -> list | None:
        return None

    @staticmethod
    def generation(cfg: DPOConfig) -> GenerationSettings:
        return GenerationSettings("native", cfg.data.max_length, cfg.eval.max_new_tokens or 256,
                                  add_special_tokens=False)

    @staticmethod
    def reward_manager(cfg: DPOConfig):
        return None

    def state(self) -> TrainedState:
        return TrainedState(self.parts.model, self.parts.tokenizer, self.optimizer, self.scheduler, self.sampler)

    def restore(self, extra: dict[str, Any]) -> None:
        pass

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        b, a = before.result, after.result
        return [f"held-out reward accuracy: before {b.accuracy:.1%} -> after {a.accuracy:.1%} ({a.num_pairs} pairs); "
                f"margin {b.margin:+.4f} -> {a.margin:+.4f}"]
