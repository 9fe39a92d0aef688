"""May a run continue from a checkpoint under a new config?  Which changes break it, which are harmless.

A change breaks continuity when the saved state would no longer mean what the new config says:
other weights or adapter shapes, another data order, another batch geometry or algorithm.  Any
other change (logging, checkpoint cadence, max_steps, learning rate, evaluation ...) is allowed
and logged; the optimizer settings among them (learning rate, weight decay, betas, eps, schedule)
take effect from the resumed step (:func:`rlft.checkpoint.resume.apply_optimizer_settings`).
The rules every kind of job shares are here; each kind adds its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# Dotted config paths (a prefix covers everything below it) whose change breaks a resume in every kind
# of job; each kind adds its own (the CONTINUITY of its job class).
COMMON_RULES: dict[str, str] = {
    "kind": "the checkpoint's state belongs to another kind of job",
    "model.path": "the checkpoint holds weights of another model",
    "model.lora": "the adapter's shape and targets are fixed by the checkpoint",
    "data.train_file": "the data order and position refer to the original training file",
    "data.prompt_field": "the prompts would differ",
    "data.messages_field": "the prompts would differ",
    "data.system_prompt": "the prompts would differ",
    "data.use_chat_template": "the prompts would differ",
    "data.chat_template": "the prompts would differ",
    "data.tools_field": "the prompts would differ",
    "data.eval_split": "the training set is what remains after the split",
    "data.shuffle": "the data order would differ",
    "train.seed": "the data order and sampling would differ",
}


def schedule_rules(kind: str, config: dict) -> dict[str, str]:
    """Rules that hold only while the learning rate varies over the run (a warm-up, a decay).

    An RL scheduler counts optimizer steps: ppo_epochs x mini-batches per training step. A resume
    restores that count, so changing either would put the new schedule at another point than the
    step the run is at (a warm-up replayed or skipped). A constant rate without warm-up does not care."""
    alg = config.get("algorithm") or {}
    if kind != "rl" or (alg.get("lr_scheduler", "constant") == "constant" and not alg.get("warmup_steps")):
        return {}
    why = (
        "the learning-rate schedule counts optimizer steps, ppo_epochs x mini-batches per step; with "
        "lr_scheduler constant and no warm-up it may change"
    )
    return {"algorithm.ppo_epochs": why, "algorithm.mini_batch_size": why}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and scalars are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _rule(path: str, rules: dict[str, str]) -> str | None:
    for key, why in rules.items():
        if path == key or path.startswith(key + "."):
            return why
    return None


def compare_configs(saved: dict, new: dict, rules: dict[str, str]) -> tuple[list[str], list[str]]:
    """Differences between the config a checkpoint was saved with and the one resuming it.

    ``rules`` maps the dotted paths that break continuity to why. Returns (breaking, harmless): one
    line per changed dotted path, ``path: old -> new``, breaking ones followed by why."""
    old_flat, new_flat = flatten(saved), flatten(new)
    breaking, harmless = [], []
    # A whole section the saved config lacks was not written by the rlft that saved it (config.yaml left
    # out rm: and dpo: before 2026-12-04): its values are unknown, not changed, so they break nothing.
    unrecorded = sorted(s for s in new if isinstance(new[s], dict) and s not in saved)
    harmless += [f"{s}: not recorded by the checkpoint; this config's values apply" for s in unrecorded]
    for path in sorted(set(old_flat) | set(new_flat)):
        old, cur = old_flat.get(path, "(unset)"), new_flat.get(path, "(unset)")
        if old == cur or path.partition(".")[0] in unrecorded:
            continue
        why = _rule(path, rules)
        line = f"{path}: {old!r} -> {cur!r}"
        if why:
            breaking.append(f"{line} ({why})")
        else:
            harmless.append(line)
    return breaking, harmless


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a file's bytes: the same path with other contents is other data."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
