"""Evaluation of a policy on held-out prompts."""

from rlft.evaluation.evaluator import EvalResult, columns_of, evaluate

__all__ = ["EvalResult", "columns_of", "evaluate"]
