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

import torch

from rlft.algorithms import sft_loss
from rlft.config.schema import JOB_KINDS, SFTConfig
from rlft.data.prompts import log_loaded
from rlft.evaluation import EvalResult
from rlft.logging.run_dir import RunDirectory
from rlft.models.logprobs import marked_token_logprobs
from rlft.models.precision import autocast
from rlft.sft.batch import collate
from rlft.sft.data import SFTSet, TrainingRow, load_sft, training_rows
from rlft.trainer.generation import evaluate_generations
from rlft.trainer.job import EvalRecord
from rlft.trainer.parts import build_model
from rlft.trainer.supervised import SupervisedJob


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


class SFTJob(SupervisedJob):
    """One supervised fine-tuning job (``kind: sft``): its items are training rows (conversations,
    packed or one a row) and its loss the cross-entropy of their trained tokens."""

    CONTINUITY = JOB_KINDS["sft"].continuity
    SECTION = "sft"

    def __init__(self, cfg: SFTConfig):
        super().__init__(cfg)
        self._last_loss = float("nan")

    def _build_model(self):
        return build_model(self.cfg.model)

    def _load(self, tokenizer) -> tuple[list, list | None]:
        cfg, s = self.cfg, self.cfg.sft
        self.train_set = load_sft(cfg.data, tokenizer, "train", cfg.train.seed, s.train_on)
        self.eval_set = load_sft(cfg.data, tokenizer, "eval", cfg.train.seed, s.train_on)
        log_loaded(self.log, self.train_set, self.eval_set, "conversations")
        rows = training_rows(self.train_set.examples, cfg.data.max_length, s.packing)
        eval_rows = training_rows(self.eval_set.examples, cfg.data.max_length, s.packing) if self.eval_set else None
        return rows, eval_rows

    def build(self, run_dir: RunDirectory) -> None:
        super().build(run_dir)
        cfg, self.rewards, self.engine = self.cfg, None, None
        if cfg.reward is not None and self.eval_set is not None:
            self.rewards = self.reward_manager(cfg)
            self.engine = self.generation(cfg).make_engine(
                self.parts.model, self.parts.tokenizer, self.parts.autocast_dtype
            )

    def describe(self) -> list[str]:
        s = self.cfg.sft
        tokens = sum(len(r.input_ids) for r in self.items)
        trained = sum(int(r.loss_mask.sum()) for r in self.items)
        packed = f", packed into {len(self.items)} rows of up to {self.cfg.data.max_length} tokens" if s.packing else ""
        lines = [
            f"sft: {len(self.train_set.examples)} examples{packed}; {tokens} tokens, {trained} trained on "
            f"({s.train_on} turns)",
            *self._parameters_lines("rows"),
        ]
        if self.rewards is not None:
            lines.append(
                "generation eval rewards: " + ", ".join(f"{n} (weight {w})" for n, w in self.rewards.weights.items())
            )
        return lines

    # ------------------------------------------------------------------ one step

    def _normaliser(self, items: list[TrainingRow]) -> float:
        return float(sum(int(r.loss_mask[1:].sum()) for r in items))  # trained tokens: a token mean

    def _token_logprobs(self, rows: list[TrainingRow]) -> torch.Tensor:
        """Log-probs [n] of the trained tokens of ``rows``, in one forward."""
        batch = collate(rows, self.pad_id).to(self.device)
        with autocast(self.parts.autocast_dtype, self.device):
            return marked_token_logprobs(
                self.parts.model, batch.input_ids, batch.attention_mask, batch.position_ids, batch.loss_mask
            )

    def _loss(self, items: list[TrainingRow], normaliser: float) -> tuple[torch.Tensor, None]:
        return sft_loss(self._token_logprobs(items), num_tokens=normaliser), None

    def _metrics(
        self, items: list[TrainingRow], normaliser: float, loss: float, stats, seconds: float
    ) -> dict[str, float]:
        self._last_loss = loss
        all_tokens = sum(len(r.input_ids) for r in items)
        return {
            "perplexity": math.exp(min(loss, 50.0)),
            "trained_tokens": normaliser,
            "tokens": float(all_tokens),
            "examples": float(sum(r.num_examples for r in items)),
            "tokens_per_s": all_tokens / seconds,
        }

    def step_line(self, step: int, m: dict[str, float]) -> str:
        return (
            f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | grad norm {m['grad_norm']:.3f} | "
            f"lr {m['lr']:.2e} | {m['step_seconds']:.2f} s/step | {m['tokens_per_s']:.0f} tok/s"
        )

    def progress_info(self) -> str:
        return f"loss {self._last_loss:.3f}"

    # ------------------------------------------------------------------ eval

    def eval_loss(self, rows: list[TrainingRow]) -> tuple[float, int]:
        """Mean negative log-likelihood per trained token over ``rows``, and the number of tokens."""
        total, count = 0.0, 0
        with self._evaluating():
            for i in range(0, len(rows), self.cfg.sft.micro_batch_size):
                lp = self._token_logprobs(rows[i : i + self.cfg.sft.micro_batch_size])
                total, count = total - float(lp.sum()), count + lp.numel()
        return total / max(count, 1), count

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        start = time.perf_counter()
        loss, count = self.eval_loss(self.eval_items or [])
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
