"""What reward-model training and DPO share: a job that steps through preference pairs.

The step is every supervised kind's (:class:`rlft.trainer.supervised.SupervisedJob`: seeded pair
order, a pair loss accumulated over micro-batches, one clipped AdamW step); this adds reading the
pairs and evaluating on the held-out ones: the share scored the right way round, the mean margin
and the loss. A subclass says how to build its model and score a pair (:meth:`PairJob._loss`), its
config section, and the names its statistics are logged under.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from rlft.data.prompts import log_loaded
from rlft.preference.data import PreferencePair, load_pairs
from rlft.trainer.job import EvalRecord
from rlft.trainer.supervised import SupervisedJob


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


class PairJob(SupervisedJob):
    """The pair loop; a subclass sets ``ACCURACY`` and ``STATS`` (and ``CONTINUITY``, ``SECTION``) and
    implements ``_build_model``, ``_loss`` and, if it refuses some pairs, ``_check_pairs``."""

    ACCURACY: ClassVar[str]  # what the evaluation's accuracy is called in the log
    #: statistic of the pair loss -> metric name in metrics.jsonl
    STATS: ClassVar[dict[str, str]]

    def __init__(self, cfg):
        super().__init__(cfg)
        self._last = float("nan")

    def _check_pairs(self, pairs: list[PreferencePair]) -> None:
        """Refuse pairs this objective cannot use (DataError naming file and line)."""

    def _load(self, tokenizer) -> tuple[list, list | None]:
        cfg = self.cfg
        self.train_set = load_pairs(cfg.data, tokenizer, "train", cfg.train.seed)
        self.eval_set = load_pairs(cfg.data, tokenizer, "eval", cfg.train.seed)
        for pairs in (self.train_set, self.eval_set):
            self._check_pairs(pairs.pairs if pairs is not None else [])
        log_loaded(self.log, self.train_set, self.eval_set, "pairs")
        return self.train_set.pairs, self.eval_set.pairs if self.eval_set is not None else None

    def _metrics(
        self, items: list, normaliser: float, loss: float, stats: list[tuple[int, Any]], seconds: float
    ) -> dict[str, float]:
        n = sum(k for k, _ in stats)
        means = {name: sum(k * getattr(st, field) for k, st in stats) / n for field, name in self.STATS.items()}
        self._last = means[self.STATS["accuracy"]]
        return {**means, "pairs": float(n)}

    def step_line(self, step: int, m: dict[str, float]) -> str:
        acc, margin = self.STATS["accuracy"], self.STATS["margin"]
        return (
            f"step {step}/{self.total_steps} | loss {m['loss']:.4f} | {self.ACCURACY} {m[acc]:.1%} | "
            f"margin {m[margin]:+.4f} | grad norm {m['grad_norm']:.3f} | lr {m['lr']:.2e} | "
            f"{m['step_seconds']:.2f} s/step"
        )

    def progress_info(self) -> str:
        return f"acc {self._last:.0%}"

    def evaluate_pairs(self, pairs: list[PreferencePair]) -> PairEvalResult:
        start = time.perf_counter()
        correct = margin = loss = 0.0
        with self._evaluating():
            for i in range(0, len(pairs), self.section.micro_batch_size):
                chunk = pairs[i : i + self.section.micro_batch_size]
                value, st = self._loss(chunk, 1.0)  # the sum over the chunk
                loss += float(value)
                correct += st.accuracy * len(chunk)
                margin += st.margin * len(chunk)
        n = len(pairs)
        return PairEvalResult(self.ACCURACY, correct / n, margin / n, loss / n, n, time.perf_counter() - start)

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        if self.eval_set is None:
            return None
        result = self.evaluate_pairs(self.eval_set.pairs)
        return EvalRecord(result, f"{result.metrics_line()} ({result.seconds:.0f}s)", result.summary())

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        b, a = before.result, after.result
        return [
            f"held-out {self.ACCURACY}: before {b.accuracy:.1%} -> after {a.accuracy:.1%} ({a.num_pairs} pairs); "
            f"margin {b.margin:+.4f} -> {a.margin:+.4f}"
        ]
