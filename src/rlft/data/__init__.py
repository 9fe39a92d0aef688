"""Prompt datasets: read .jsonl/.json/.csv/.parquet rows and format them as prompts."""

from rlft.data.prompts import PromptExample, PromptSet, build_examples, format_prompt, load_prompts
from rlft.data.readers import SUPPORTED_FORMATS, ReadResult, read_rows

__all__ = [
    "SUPPORTED_FORMATS",
    "PromptExample",
    "PromptSet",
    "ReadResult",
    "build_examples",
    "format_prompt",
    "load_prompts",
    "read_rows",
]
