"""The reward-model job (``kind: rm``, ``rlft train-rm``): a scalar head on the model, trained on
preference pairs with the Bradley-Terry loss.

Same lifecycle as RL and SFT (:class:`rlft.trainer.trainer.Trainer`): run directory, checkpoints,
exact resume, evaluation cadence. A checkpoint is a Hugging Face ``AutoModelForSequenceClassification``
folder (``num_labels: 1``) that loads without rlft and is a valid ``path`` for a model reward.
Evaluation reports the held-out pairwise accuracy (the share of pairs scored the right way round),
the mean margin and the loss.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from rlft.algorithms import bradley_terry_loss
from rlft.config.schema import JOB_KINDS, RMConfig
from rlft.data.prompts import log_loaded
from rlft.data.sampler import PromptSampler
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory
from rlft.models.precision import autocast
from rlft.models.reward_model import left_pad, sequence_scores
from rlft.preference.data import PreferencePair, load_pairs
from rlft.trainer.generation import GenerationSettings
from rlft.trainer.job import EvalRecord, TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.optim import build_optimizer, build_scheduler, clipped_step
from rlft.trainer.parts import build_reward_model


@dataclass
class RMEvalResult:
    """Held-out pairwise accuracy, mean margin r_chosen - r_rejected, and the Bradley-Terry loss."""

    accuracy: float
    margin: float
    loss: float
    num_pairs: int
    seconds: float

    def metrics_line(self) -> str:
        return (f"pairwise accuracy {self.accuracy:.1%}, margin {self.margin:+.3f}, loss {self.loss:.4f} "
                f"on {self.num_pairs} pairs")

    def summary(self) -> dict:
        return {"accuracy": self.accuracy, "margin": self.margin, "loss": self.loss, "num_pairs": self.num_pairs,
                "seconds": self.seconds}


class RMJob:
    """One reward-model training job."""

    CONTINUITY = JOB_KINDS["rm"].continuity

    def __init__(self, cfg: RMConfig):
        self.cfg = cfg
        self._last = float("nan")

    def build(self, run_dir: RunDirectory) -> None:
        cfg, r = self.cfg, self.cfg.rm
        self.log = get_logger()
        self.parts = build_reward_model(cfg.model)
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        tok = self.parts.tokenizer
        self.pad_id = tok.pad_token_id
        self.train_set = load_pairs(cfg.data, tok, "train", cfg.train.seed)
        self.eval_set = load_pairs(cfg.data, tok, "eval", cfg.train.seed)
        log_loaded(self.log, self.train_set, self.eval_set, "pairs")
        self.sampler = PromptSampler(len(self.train_set.pairs), r.batch_size, seed=cfg.train.seed,
                                     shuffle=cfg.data.shuffle)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        self.optimizer = build_optimizer(self.parts.model.parameters(), lr=r.learning_rate,
                                         weight_decay=r.weight_decay, betas=tuple(r.adam_betas), eps=r.adam_eps)
        self.scheduler = build_scheduler(self.optimizer, total_steps=self.total_steps, warmup_steps=r.warmup_steps,
                                         schedule=r.lr_scheduler, min_ratio=r.min_lr_ratio)

    def describe(self) -> list[str]:
        r = self.cfg.rm
        return [f"reward model: {len(self.train_set.pairs)} preference pairs, Bradley-Terry loss"
                + (f", margin {r.margin}" if r.margin else "")
                + (f", margin column '{self.cfg.data.margin_field}'" if self.cfg.data.margin_field else ""),
                "rm parameters in effect: " + ", ".join(f"{k}={v}" for k, v in r.model_dump().items()),
                f"training for {self.total_steps} steps: {r.batch_size} pairs per step ({r.micro_batch_size} per "
                f"forward/backward), {self.steps_per_epoch} steps per epoch"]

    # ------------------------------------------------------------------ one step

    def _scores(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) scores [b] of ``pairs``: both sides in one forward of 2b rows."""
        ids, mask = left_pad([p.chosen for p in pairs] + [p.rejected for p in pairs], self.pad_id, self.device)
        with autocast(self.parts.autocast_dtype, self.device):
            scores = sequence_scores(self.parts.model, ids, mask)
        return scores[: len(pairs)], scores[len(pairs):]

    def _loss(self, pairs: list[PreferencePair], num_pairs: float):
        chosen, rejected = self._scores(pairs)
        margin = torch.tensor([p.margin for p in pairs], device=chosen.device) + self.cfg.rm.margin
        return bradley_terry_loss(chosen, rejected, margin=margin, num_pairs=num_pairs,
                                  center_coef=self.cfg.rm.center_rewards_coef)

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pairs = [self.train_set.pairs[i] for i in self.sampler.next_batch()]
        model, r = self.parts.model, self.cfg.rm
        model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = 0.0, []
        for i in range(0, len(pairs), r.micro_batch_size):
            chunk = pairs[i : i + r.micro_batch_size]
            loss, s = self._loss(chunk, float(len(pairs)))
            loss.backward()
            loss_sum += float(loss.detach())
            stats.append((len(chunk), s))
        params = [p for p in model.parameters() if p.requires_grad]
        grad = clipped_step(self.optimizer, self.scheduler, params, r.max_grad_norm)
        if "skipped_updates" in grad:
            self.log.warning(f"step {step}: non-finite gradient norm ({grad['grad_norm']}); optimizer step skipped")
        n = sum(k for k, _ in stats)

        def mean(attr: str) -> float:
            return sum(k * getattr(s, attr) for k, s in stats) / n

        self._last = mean("accuracy")
        seconds = time.perf_counter() - t0
        return {"loss": loss_sum, "accuracy": mean("accuracy"), "margin": mean("margin"),
                "reward/chosen": mean("chosen"), "reward/rejected": mean("rejected"), **grad, "lr": lr,
                "pairs": float(n), "step_seconds": seconds, "peak_mem_mb": peak_memory_mb(self.device)}

    def step_line(self, step: int, m: dict[str, float]) -> str:
        return (f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | accuracy {m['accuracy']:.1%} | "
                f"margin {m['margin']:+.3f} | grad norm {m['grad_norm']:.3f} | lr {m['lr']:.2e} | "
                f"{m['step_seconds']:.2f} s/step")

    def progress_info(self) -> str:
        return f"acc {self._last:.0%}"

    # ------------------------------------------------------------------ eval / state

    @torch.no_grad()
    def evaluate_pairs(self, pairs: list[PreferencePair]) -> RMEvalResult:
        start = time.perf_counter()
        model = self.parts.model
        was_training = model.training
        model.eval()
        correct = margin = loss = 0.0
        try:
            for i in range(0, len(pairs), self.cfg.rm.micro_batch_size):
                chunk = pairs[i : i + self.cfg.rm.micro_batch_size]
                value, s = self._loss(chunk, 1.0)  # the sum over the chunk
                loss, correct, margin = loss + float(value), correct + s.accuracy * len(chunk), margin + s.margin * len(chunk)
        finally:
            model.train(was_training)
        n = len(pairs)
        return RMEvalResult(correct / n, margin / n, loss / n, n, time.perf_counter() - start)

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        result = self.evaluate_pairs(self.eval_set.pairs)
        return EvalRecord(result, f"{result.metrics_line()} ({result.seconds:.0f}s)", result.summary())

    @staticmethod
    def eval_prompts(cfg: RMConfig, tokenizer) -> list | None:
        return None  # a reward model is evaluated on pairs, not on generations

    @staticmethod
    def generation(cfg: RMConfig) -> GenerationSettings:
        return GenerationSettings("native", cfg.data.max_length, 0, add_special_tokens=False)

    @staticmethod
    def reward_manager(cfg: RMConfig):
        return None

    def state(self) -> TrainedState:
        return TrainedState(self.parts.model, self.parts.tokenizer, self.optimizer, self.scheduler, self.sampler)

    def restore(self, extra: dict[str, Any]) -> None:
        pass  # weights, optimizer, scheduler, data position and RNG are all the state it has

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        b, a = before.result, after.result
        return [f"held-out pairwise accuracy: before {b.accuracy:.1%} -> after {a.accuracy:.1%} ({a.num_pairs} pairs); "
                f"margin {b.margin:+.3f} -> {a.margin:+.3f}"]
