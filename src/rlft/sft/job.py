"""The SFT job: cross-entropy on the assistant tokens of conversations, one optimizer step at a time.

Same lifecycle as RL (:class:`rlft.trainer.trainer.Trainer`): run directory, checkpoints in Hugging
Face format (a valid ``model.path`` for an RL run), exact resume, evaluation cadence. Evaluation
reports the held-out loss; with a ``reward:`` section it also generates the last assistant turn of
every held-out conversation and scores it with those rewards, as an RL run's evaluation does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from rlft.algorithms import sft_loss
from rlft.config.schema import JOB_KINDS, SFTConfig
from rlft.data.prompts import log_loaded
from rlft.data.sampler import PromptSampler
from rlft.evaluation import EvalResult
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory
from rlft.models.logprobs import marked_token_logprobs
from rlft.models.precision import autocast
from rlft.sft.batch import collate
from rlft.sft.data import SFTSet, TrainingRow, load_sft, training_rows
from rlft.trainer.generation import GenerationSettings, evaluate_generations
from rlft.trainer.job import EvalRecord, TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.optim import build_optimizer, build_scheduler, clipped_step
from rlft.trainer.parts import build_model


@dataclass
class SFTEvalResult:
    """loss: mean negative log-likelihood per trained token of the held-out rows; generation: the
    reward-scored generation evaluation (when the config has rewards)."""

    loss: float
    num_rows: int
    num_tokens: int
    seconds: float
    generation: EvalResult | None = None

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))

    @property
    def accuracy(self) -> float | None:
        return self.generation.accuracy if self.generation is not None else None

    def metrics_line(self) -> str:
        line = f"loss {self.loss:.4f} (perplexity {self.perplexity:.2f}) on {self.num_rows} rows"
        return line + (f"; {self.generation.metrics_line()}" if self.generation is not None else "")

    def summary(self) -> dict:
        out = {
            "eval_loss": self.loss,
            "perplexity": self.perplexity,
            "num_rows": self.num_rows,
            "num_tokens": self.num_tokens,
            "seconds": self.seconds,
        }
        return {**out, **self.generation.summary()} if self.generation is not None else out


class SFTJob:
    """One supervised fine-tuning job (``kind: sft``)."""

    CONTINUITY = JOB_KINDS["sft"].continuity

    def __init__(self, cfg: SFTConfig):
        self.cfg = cfg
        self._last_loss = float("nan")

    def build(self, run_dir: RunDirectory) -> None:
        cfg, s = self.cfg, self.cfg.sft
        self.log = get_logger()
        self.parts = build_model(cfg.model)
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        tok = self.parts.tokenizer
        self.train_set = load_sft(cfg.data, tok, "train", cfg.train.seed, s.train_on)
        self.eval_set = load_sft(cfg.data, tok, "eval", cfg.train.seed, s.train_on)
        log_loaded(self.log, self.train_set, self.eval_set, "conversations")
        self.rows = training_rows(self.train_set.examples, cfg.data.max_length, s.packing)
        self.eval_rows = training_rows(self.eval_set.examples, cfg.data.max_length, s.packing) if self.eval_set else []
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.sampler = PromptSampler(len(self.rows), s.batch_size, seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        self.optimizer = build_optimizer(
            self.parts.model.parameters(),
            lr=s.learning_rate,
            weight_decay=s.weight_decay,
            betas=tuple(s.adam_betas),
            eps=s.adam_eps,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            total_steps=self.total_steps,
            warmup_steps=s.warmup_steps,
            schedule=s.lr_scheduler,
            min_ratio=s.min_lr_ratio,
        )
        self.rewards = self.engine = None
        if cfg.reward is not None and self.eval_set is not None:
            self.rewards = self.reward_manager(cfg)
            self.engine = self.generation(cfg).make_engine(self.parts.model, tok, self.parts.autocast_dtype)

    def describe(self) -> list[str]:
        s = self.cfg.sft
        tokens = sum(len(r.input_ids) for r in self.rows)
        trained = sum(int(r.loss_mask.sum()) for r in self.rows)
        packed = f", packed into {len(self.rows)} rows of up to {self.cfg.data.max_length} tokens" if s.packing else ""
        lines = [
            f"sft: {len(self.train_set.examples)} examples{packed}; {tokens} tokens, {trained} trained on "
            f"({s.train_on} turns)",
            "sft parameters in effect: " + ", ".join(f"{k}={v}" for k, v in s.model_dump().items()),
            f"training for {self.total_steps} steps: {s.batch_size} rows per step ({s.micro_batch_size} per "
            f"forward/backward), {self.steps_per_epoch} steps per epoch",
        ]
        if self.rewards is not None:
            lines.append(
                "generation eval rewards: " + ", ".join(f"{n} (weight {w})" for n, w in self.rewards.weights.items())
            )
        return lines

    # ------------------------------------------------------------------ one step

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        rows = [self.rows[i] for i in self.sampler.next_batch()]
        model = self.parts.model
        model.train()
        num_tokens = float(sum(int(r.loss_mask[1:].sum()) for r in rows))
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for i in range(0, len(rows), self.cfg.sft.micro_batch_size):
            batch = collate(rows[i : i + self.cfg.sft.micro_batch_size], self.pad_id).to(self.device)
            with autocast(self.parts.autocast_dtype, self.device):
                lp = marked_token_logprobs(
                    model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.loss_mask
                )
            loss = sft_loss(lp, num_tokens=num_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
        params = [p for p in model.parameters() if p.requires_grad]
        stats = clipped_step(self.optimizer, self.scheduler, params, self.cfg.sft.max_grad_norm)
        if "skipped_updates" in stats:
            self.log.warning(f"step {step}: non-finite gradient norm ({stats['grad_norm']}); optimizer step skipped")
        seconds = time.perf_counter() - t0
        all_tokens = sum(len(r.input_ids) for r in rows)
        self._last_loss = loss_sum
        return {
            "loss": loss_sum,
            "perplexity": math.exp(min(loss_sum, 50.0)),
            **stats,
            "lr": lr,
            "trained_tokens": num_tokens,
            "tokens": float(all_tokens),
            "examples": float(sum(r.num_examples for r in rows)),
            "step_seconds": seconds,
            "tokens_per_s": all_tokens / seconds,
            "peak_mem_mb": peak_memory_mb(self.device),
        }

    def step_line(self, step: int, m: dict[str, float]) -> str:
        return (
            f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | grad norm {m['grad_norm']:.3f} | "
            f"lr {m['lr']:.2e} | {m['step_seconds']:.2f} s/step | {m['tokens_per_s']:.0f} tok/s"
        )

    def progress_info(self) -> str:
        return f"loss {self._last_loss:.3f}"

    # ------------------------------------------------------------------ eval / state

    @torch.no_grad()
    def eval_loss(self, rows: list[TrainingRow]) -> tuple[float, int]:
        """Mean negative log-likelihood per trained token over ``rows``, and the number of tokens."""
        model = self.parts.model
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            for i in range(0, len(rows), self.cfg.sft.micro_batch_size):
                batch = collate(rows[i : i + self.cfg.sft.micro_batch_size], self.pad_id).to(self.device)
                with autocast(self.parts.autocast_dtype, self.device):
                    lp = marked_token_logprobs(
                        model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.loss_mask
                    )
                total, count = total - float(lp.sum()), count + lp.numel()
        finally:
            model.train(was_training)
        return total / max(count, 1), count

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        start = time.perf_counter()
        loss, count = self.eval_loss(self.eval_rows)
        result = SFTEvalResult(loss, len(self.eval_set.examples), count, 0.0, self._generation_eval(self.eval_set))
        result.seconds = time.perf_counter() - start
        payload = {**result.summary(), "samples": result.generation.samples if result.generation else []}
        return EvalRecord(result, f"{result.metrics_line()} ({result.seconds:.0f}s)", payload)

    def _generation_eval(self, evalset: SFTSet) -> EvalResult | None:
        if self.rewards is None:
            return None
        prompts = [p for p in (ex.prompt_example(self.parts.tokenizer) for ex in evalset.examples) if p is not None]
        if not prompts:  # plain-text rows: the loss is the whole evaluation
            return None
        return evaluate_generations(
            self.engine, prompts, self.rewards, self.cfg, self.generation(self.cfg).max_new_tokens
        )

    @staticmethod
    def eval_prompts(cfg: SFTConfig, tokenizer) -> list | None:
        """The last assistant turn of every held-out conversation, as a prompt (plain-text rows have none)."""
        evalset = load_sft(cfg.data, tokenizer, "eval", cfg.train.seed, cfg.sft.train_on)
        if evalset is None:
            return None
        return [p for p in (ex.prompt_example(tokenizer) for ex in evalset.examples) if p is not None]

    @staticmethod
    def reward_manager(cfg: SFTConfig):
        """The rewards of the generation evaluation (None without a reward: section)."""
        from rlft.rewards.manager import RewardManager

        return RewardManager.from_specs(cfg.reward.functions) if cfg.reward is not None else None

    @staticmethod
    def generation(cfg: SFTConfig) -> GenerationSettings:
        # The chat template has already put the special tokens into every prompt.
        return GenerationSettings(
            "native", cfg.data.max_length, cfg.eval.max_new_tokens or 256, add_special_tokens=False
        )

    def state(self) -> TrainedState:
        return TrainedState(self.parts.model, self.parts.tokenizer, self.optimizer, self.scheduler, self.sampler)

    def restore(self, extra: dict[str, Any]) -> None:
        pass  # the optimizer, scheduler, data position and RNG are all the state SFT has

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        b, a = before.result, after.result
        lines = [f"held-out loss: before {b.loss:.4f} -> after {a.loss:.4f} ({a.num_rows} conversations)"]
        if a.accuracy is not None:
            lines.append(
                f"held-out accuracy: before {b.accuracy:.1%} -> after {a.accuracy:.1%} "
                f"({a.generation.num_prompts} prompts)"
            )
        return lines
