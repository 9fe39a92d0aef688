"""What every supervised kind of job shares (SFT, reward-model training, DPO): a fixed dataset in a
seeded, resumable order, a loss accumulated over micro-batches, one clipped AdamW step.

A kind says how to build its model, load its items (conversations, preference pairs) and score a
micro-batch of them (:meth:`SupervisedJob._loss`); this class does the rest: the optimizer and
schedule from the kind's config section, the step's micro-batch loop (each micro-batch's loss is
divided by the normaliser of the whole step, so any split gives the same gradient), the skipped
non-finite step, and the state a checkpoint keeps. RL steps through rollouts instead and is not one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from rlft.data.sampler import PromptSampler
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory
from rlft.trainer.generation import GenerationSettings
from rlft.trainer.job import TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.optim import build_optimizer, build_scheduler, clipped_step
from rlft.trainer.parts import ModelParts


class SupervisedJob:
    """The shared build and step; a kind sets ``CONTINUITY`` and ``SECTION`` and implements the
    methods under "what a kind provides" (plus ``describe``, ``step_line``, ``progress_info``,
    ``evaluate`` and ``report``, which the lifecycle calls)."""

    CONTINUITY: ClassVar[dict[str, str]]
    SECTION: ClassVar[str]  # the config section with the optimizer settings: "sft", "rm", "dpo"

    def __init__(self, cfg):
        self.cfg = cfg

    @property
    def section(self):
        return getattr(self.cfg, self.SECTION)

    # -- what a kind provides

    def _build_model(self) -> ModelParts:
        """The model to train (with its reference, for DPO)."""
        raise NotImplementedError

    def _load(self, tokenizer) -> tuple[list, list | None]:
        """(the training items, the held-out items or None), logged as loaded."""
        raise NotImplementedError

    def _normaliser(self, items: list) -> float:
        """What a step's loss is divided by: the number of items, unless the kind says otherwise."""
        return float(len(items))

    def _loss(self, items: list, normaliser: float) -> tuple[torch.Tensor, Any]:
        """(the loss of ``items`` summed and divided by ``normaliser``, the kind's statistics of them)."""
        raise NotImplementedError

    def _metrics(
        self, items: list, normaliser: float, loss: float, stats: list[tuple[int, Any]], seconds: float
    ) -> dict[str, float]:
        """The kind's own metrics of a step; ``stats``: (items, statistics) of each micro-batch."""
        return {}

    # -- the shared part

    def build(self, run_dir: RunDirectory) -> None:
        cfg, s = self.cfg, self.section
        self.log = get_logger()
        self.parts = self._build_model()
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        tok = self.parts.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.items, self.eval_items = self._load(tok)
        self.sampler = PromptSampler(len(self.items), s.batch_size, seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        params = [p for p in self.parts.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(
            params,
            lr=s.learning_rate,
            weight_decay=s.weight_decay,
            betas=s.adam_betas,
            eps=s.adam_eps,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            total_steps=self.total_steps,
            warmup_steps=s.warmup_steps,
            schedule=s.lr_scheduler,
            min_ratio=s.min_lr_ratio,
        )

    def _parameters_lines(self, unit: str) -> list[str]:
        """The section's settings in effect and the batch geometry, for ``describe``."""
        s = self.section
        return [
            f"{self.SECTION} parameters in effect: " + ", ".join(f"{k}={v}" for k, v in s.model_dump().items()),
            f"training for {self.total_steps} steps: {s.batch_size} {unit} per step ({s.micro_batch_size} per "
            f"forward/backward), {self.steps_per_epoch} steps per epoch",
        ]

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        items = [self.items[i] for i in self.sampler.next_batch()]
        model, s = self.parts.model, self.section
        model.train()
        normaliser = self._normaliser(items)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = 0.0, []
        for i in range(0, len(items), s.micro_batch_size):
            chunk = items[i : i + s.micro_batch_size]
            loss, st = self._loss(chunk, normaliser)
            loss.backward()
            loss_sum += float(loss.detach())
            stats.append((len(chunk), st))
        params = [p for p in model.parameters() if p.requires_grad]
        grad = clipped_step(self.optimizer, self.scheduler, params, s.max_grad_norm)
        if "skipped_updates" in grad:
            self.log.warning(f"step {step}: non-finite gradient norm ({grad['grad_norm']}); optimizer step skipped")
        seconds = time.perf_counter() - t0
        return {
            "loss": loss_sum,
            **self._metrics(items, normaliser, loss_sum, stats, seconds),
            **grad,
            "lr": lr,
            "step_seconds": seconds,
            "peak_mem_mb": peak_memory_mb(self.device),
        }

    @contextmanager
    def _evaluating(self) -> Iterator[torch.nn.Module]:
        """The model in eval mode and without gradients, put back as it was afterwards."""
        model = self.parts.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                yield model
        finally:
            model.train(was_training)

    def state(self) -> TrainedState:
        return TrainedState(self.parts.model, self.parts.tokenizer, self.optimizer, self.scheduler, self.sampler)

    def restore(self, extra: dict[str, Any]) -> None:
        pass  # weights, optimizer, scheduler, data position and RNG are all the state these jobs have

    # -- used without a built job too (rlft eval): these kinds do not generate unless they say so

    @staticmethod
    def eval_prompts(cfg, tokenizer) -> list | None:
        return None

    @staticmethod
    def generation(cfg) -> GenerationSettings:
        # The chat template has already put the special tokens into every prompt.
        return GenerationSettings(
            "native", cfg.data.max_length, cfg.eval.max_new_tokens or 256, add_special_tokens=False
        )

    @staticmethod
    def reward_manager(cfg):
        return None
