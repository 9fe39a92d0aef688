"""What reward-model training and DPO share: a job that steps through preference pairs.

Both sample pairs in a seeded, resumable order, accumulate a pair loss over micro-batches (each
micro-batch's loss divided by the pairs of the whole step, so any split gives the same gradient),
take one clipped AdamW step, and evaluate on the held-out pairs: the share scored the right way
round, the mean margin and the loss. A subclass says how to build its model and score a pair
(:meth:`PairJob._loss`), its config section, and the names its statistics are logged under.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rlft.data.prompts import log_loaded
from rlft.data.sampler import PromptSampler
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory
from rlft.preference.data import PreferencePair, load_pairs
from rlft.trainer.generation import GenerationSettings
from rlft.trainer.job import EvalRecord, TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.optim import build_optimizer, build_scheduler, clipped_step


@dataclass
class PairEvalResult:
    """Held-out pairs: accuracy (the share scored the right way round), mean margin, mean loss."""

    label: str
    accuracy: float
    margin: float
    loss: float
    num_pairs: int
    seconds: float

    def metrics_line(self) -> str:
        return (
            f"{self.label} {self.accuracy:.1%}, margin {self.margin:+.4f}, loss {self.loss:.4f} "
            f"on {self.num_pairs} pairs"
        )

    def summary(self) -> dict:
        return {
            "accuracy": self.accuracy,
            "margin": self.margin,
            "loss": self.loss,
            "num_pairs": self.num_pairs,
            "seconds": self.seconds,
        }


class PairJob:
    """The shared loop; subclasses set the class attributes and implement the three methods below."""

    CONTINUITY: ClassVar[dict[str, str]]
    SECTION: ClassVar[str]  # the config section: "rm", "dpo"
    ACCURACY: ClassVar[str]  # what the evaluation's accuracy is called in the log
    #: statistic of the pair loss -> metric name in metrics.jsonl
    STATS: ClassVar[dict[str, str]]

    def __init__(self, cfg):
        self.cfg = cfg
        self._last = float("nan")

    # -- what a subclass provides

    def _build_model(self):
        """The ``ModelParts`` to train (a reward model; a policy with its reference)."""
        raise NotImplementedError

    def _loss(self, pairs: list[PreferencePair], num_pairs: float):
        """(loss summed over ``pairs`` / num_pairs, statistics with the fields of ``STATS``)."""
        raise NotImplementedError

    def _check_pairs(self, pairs: list[PreferencePair]) -> None:
        """Refuse pairs this objective cannot use (DataError naming file and line)."""

    # -- the shared loop

    @property
    def section(self):
        return getattr(self.cfg, self.SECTION)

    def build(self, run_dir: RunDirectory) -> None:
        cfg, s = self.cfg, self.section
        self.log = get_logger()
        self.parts = self._build_model()
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        tok = self.parts.tokenizer
        self.pad_id = tok.pad_token_id
        self.train_set = load_pairs(cfg.data, tok, "train", cfg.train.seed)
        self.eval_set = load_pairs(cfg.data, tok, "eval", cfg.train.seed)
        for pairs in (self.train_set, self.eval_set):
            self._check_pairs(pairs.pairs if pairs is not None else [])
        log_loaded(self.log, self.train_set, self.eval_set, "pairs")
        self.sampler = PromptSampler(
            len(self.train_set.pairs), s.batch_size, seed=cfg.train.seed, shuffle=cfg.data.shuffle
        )
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        params = [p for p in self.parts.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(
            params, lr=s.learning_rate, weight_decay=s.weight_decay, betas=tuple(s.adam_betas), eps=s.adam_eps
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            total_steps=self.total_steps,
            warmup_steps=s.warmup_steps,
            schedule=s.lr_scheduler,
            min_ratio=s.min_lr_ratio,
        )

    def _parameters_line(self) -> list[str]:
        s = self.section
        return [
            f"{self.SECTION} parameters in effect: " + ", ".join(f"{k}={v}" for k, v in s.model_dump().items()),
            f"training for {self.total_steps} steps: {s.batch_size} pairs per step ({s.micro_batch_size} per "
            f"forward/backward), {self.steps_per_epoch} steps per epoch",
        ]

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pairs = [self.train_set.pairs[i] for i in self.sampler.next_batch()]
        model, s = self.parts.model, self.section
        model.train()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = 0.0, []
        for i in range(0, len(pairs), s.micro_batch_size):
            chunk = pairs[i : i + s.micro_batch_size]
            loss, st = self._loss(chunk, float(len(pairs)))
            loss.backward()
            loss_sum += float(loss.detach())
            stats.append((len(chunk), st))
        params = [p for p in model.parameters() if p.requires_grad]
        grad = clipped_step(self.optimizer, self.scheduler, params, s.max_grad_norm)
        if "skipped_updates" in grad:
            self.log.warning(f"step {step}: non-finite gradient norm ({grad['grad_norm']}); optimizer step skipped")
        n = sum(k for k, _ in stats)
        means = {name: sum(k * getattr(st, field) for k, st in stats) / n for field, name in self.STATS.items()}
        self._last = means[self.STATS["accuracy"]]
        return {
            "loss": loss_sum,
            **means,
            **grad,
            "lr": lr,
            "pairs": float(n),
            "step_seconds": time.perf_counter() - t0,
            "peak_mem_mb": peak_memory_mb(self.device),
        }

    def step_line(self, step: int, m: dict[str, float]) -> str:
        acc, margin = self.STATS["accuracy"], self.STATS["margin"]
        return (
            f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | {self.ACCURACY} {m[acc]:.1%} | "
            f"margin {m[margin]:+.4f} | grad norm {m['grad_norm']:.3f} | lr {m['lr']:.2e} | "
            f"{m['step_seconds']:.2f} s/step"
        )

    def progress_info(self) -> str:
        return f"acc {self._last:.0%}"

    @torch.no_grad()
    def evaluate_pairs(self, pairs: list[PreferencePair]) -> PairEvalResult:
        start = time.perf_counter()
        model = self.parts.model
        was_training = model.training
        model.eval()
        correct = margin = loss = 0.0
        try:
            for i in range(0, len(pairs), self.section.micro_batch_size):
                chunk = pairs[i : i + self.section.micro_batch_size]
                value, st = self._loss(chunk, 1.0)  # the sum over the chunk
                loss += float(value)
                correct += st.accuracy * len(chunk)
                margin += st.margin * len(chunk)
        finally:
            model.train(was_training)
        n = len(pairs)
        return PairEvalResult(self.ACCURACY, correct / n, margin / n, loss / n, n, time.perf_counter() - start)

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        result = self.evaluate_pairs(self.eval_set.pairs)
        return EvalRecord(result, f"{result.metrics_line()} ({result.seconds:.0f}s)", result.summary())

    @staticmethod
    def eval_prompts(cfg, tokenizer) -> list | None:
        return None  # evaluated on held-out pairs, not on generations

    @staticmethod
    def generation(cfg) -> GenerationSettings:
        return GenerationSettings(
            "native", cfg.data.max_length, cfg.eval.max_new_tokens or 256, add_special_tokens=False
        )

    @staticmethod
    def reward_manager(cfg):
        return None

    def state(self) -> TrainedState:
        return TrainedState(self.parts.model, self.parts.tokenizer, self.optimizer, self.scheduler, self.sampler)

    def restore(self, extra: dict[str, Any]) -> None:
        pass  # weights, optimizer, scheduler, data position and RNG are all the state these jobs have

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        b, a = before.result, after.result
        return [
            f"held-out {self.ACCURACY}: before {b.accuracy:.1%} -> after {a.accuracy:.1%} ({a.num_pairs} pairs); "
            f"margin {b.margin:+.4f} -> {a.margin:+.4f}"
        ]
