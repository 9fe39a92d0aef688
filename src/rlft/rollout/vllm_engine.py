"""Rollouts through vLLM on the training GPU: ``rollout.engine: vllm`` (the ``vllm`` extra, CUDA only).

vLLM runs in this process, colocated with training on the same GPU, with its own bf16 copy of the
weights. The policy's weights are pushed into that copy in memory, never through a checkpoint on
disk: ``LLM.apply_model`` runs the model's own ``load_weights`` on ``(name, tensor)`` pairs read
straight from the trainer's parameters (cast to bf16 as they are copied). A push happens only when an
optimizer step (or any in-place write) changed the policy since the last one, which a
:class:`~rlft.speed.change_watch.ChangeWatch` tells at the cost of reading the parameters' version
counters, so evaluation batches and dynamic-sampling rounds between two steps push nothing. A LoRA
policy is pushed with every adapter merged into its layer's weight (W + scale * B @ A), so vLLM
serves one plain model and needs no LoRA support of its own.

With ``rollout.vllm_sleep_between_steps`` the job calls :meth:`VLLMEngine.release_memory` once the
step's rollouts are collected: vLLM sleeps at level 2 (its weights and KV cache are released, so the
update has that memory) and the next :meth:`run` wakes it and pushes the weights again.

Sampling log-probs are vLLM's ``processed_logprobs`` of the sampled token (``logprobs=0``): those of
the temperature-scaled distribution it sampled from, i.e. the trainer's tempered log-probs in exact
arithmetic when ``top_k``/``top_p``/``min_new_tokens`` are off; with them on, they are the truncated
distribution's (a departure from the other engines, which report the unconstrained one). Their gap
to the trainer's own (bf16 kernels differ) is what ``rollout/logprob_mismatch`` measures and
``algorithm.tis_cap`` corrects.

``vllm`` is imported only when the engine is built, never on a machine without it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from rlft.errors import UsageError
from rlft.models.weight_stream import checkpoint_weights
from rlft.rollout.base import RolloutBatch, SamplingParams
from rlft.rollout.hf_engine import eos_token_ids, left_padded
from rlft.speed.change_watch import ChangeWatch
from rlft.speed.clock import count, phase

INSTALL_HINT = "pip install 'rlft[vllm]'"
_SEED_MOD = 2**31 - 1


def require_vllm(device: torch.device) -> None:
    """Raise :class:`UsageError` (exit 2) naming what ``rollout.engine: vllm`` lacks here: the vllm
    package, a CUDA GPU, or the policy on the GPU vLLM runs on (cuda:0)."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append(f"the vllm package, which is not installed ({INSTALL_HINT})")
    if not torch.cuda.is_available():
        build = (
            f"this torch build has CUDA {torch.version.cuda} but sees no GPU"
            if torch.version.cuda
            else "this torch build is CPU-only"
        )
        missing.append(f"a CUDA GPU ({build})")
    if missing:
        raise UsageError(
            "rollout.engine: vllm needs " + " and ".join(missing) + "; without them use rollout.engine: native"
        )
    if device.type != "cuda" or device.index not in (None, 0):
        raise UsageError(
            f"rollout.engine: vllm runs vLLM on cuda:0 next to the policy, but the policy is on {device}; "
            f"set model.device: cuda (choose the GPU with CUDA_VISIBLE_DEVICES)"
        )


class VLLMEngine:
    """The :class:`~rlft.rollout.base.RolloutEngine` contract on vLLM, colocated with training.

    ``model``: the policy (full or LoRA) on cuda:0; ``model_dir``: the Hugging Face directory vLLM
    starts from (default: the one the policy was loaded from); its weights are replaced by the
    policy's before the first rollout anyway. ``gpu_memory_utilization``: vLLM's share of the GPU;
    ``sleep_between_steps``: sleep (level 2) on :meth:`release_memory`. ``decode_copy`` and
    ``fused_decode`` are the native engine's and are ignored here.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_prompt_length: int,
        autocast_dtype: torch.dtype | None,
        add_special_tokens: bool = False,
        decode_copy: bool = True,
        fused_decode: bool = True,
        gpu_memory_utilization: float = 0.3,
        sleep_between_steps: bool = True,
        model_dir: str | Path | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        require_vllm(self.device)
        self.max_prompt_length, self.add_special_tokens = max_prompt_length, add_special_tokens
        self.autocast_dtype = autocast_dtype
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.sleep_between_steps = sleep_between_steps
        self.llm = start_vllm(model_dir or policy_model_dir(model), gpu_memory_utilization)
        # Every parameter, one group: changed() says whether anything moved since the last push.
        self._watch = ChangeWatch([list(model.parameters())], start_changed=True)
        self.weights_version = 0  # pushes so far; the first run() makes it 1
        self._asleep = False

    # ------------------------------------------------------------------ weights and memory

    def sync_weights(self, model: torch.nn.Module | None = None) -> int:
        """Push ``model``'s weights (default: the policy) into vLLM now, LoRA adapters merged; returns
        the new ``weights_version``. :meth:`run` calls it when the policy changed."""
        weights = checkpoint_weights(self.model if model is None else model)
        with phase("weight_sync"):
            self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights))
            self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.weights_version += 1
        count("weight_syncs", 1)
        return self.weights_version

    def release_memory(self) -> None:
        """Between rollouts and the update: with ``sleep_between_steps``, vLLM releases its weights
        and KV cache (sleep level 2) until the next :meth:`run`."""
        if self.sleep_between_steps and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    def _ready(self) -> None:
        """Awake, with the policy's current weights: pushed after a wake-up (level 2 dropped them) or
        when an optimizer step or other write changed the policy since the last push."""
        changed = bool(self._watch.changed())
        if self._asleep:
            self.llm.wake_up(tags=["weights"])
            self.sync_weights()
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        elif changed:
            self.sync_weights()

    # ------------------------------------------------------------------ generation

    def run(self, examples: list, sampling: SamplingParams) -> RolloutBatch:
        """``sampling.n`` completions per formatted prompt ``example.text``, contiguous per prompt."""
        return self.generate([ex.text for ex in examples], sampling)

    def generate(self, prompts: list[str], sampling: SamplingParams) -> RolloutBatch:
        prompt_ids, prompt_mask = self.tokenize_prompts(prompts)
        self._ready()
        n = sampling.n
        requests = [
            {"prompt_token_ids": ids[m.bool()].tolist()} for ids, m in zip(prompt_ids, prompt_mask) for _ in range(n)
        ]  # one request per completion: each has its own seed
        params = [self.vllm_sampling(sampling, seed) for seed in row_seeds(sampling, len(requests))]
        with phase("decode"):
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        count("prefill_tokens", int(prompt_mask.sum()))
        rows = [completion_row(out.outputs[0]) for out in outputs]
        count("decode_tokens", sum(len(tokens) for tokens, _, _ in rows))
        return self._batch(prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0), rows, n)

    def tokenize_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded, left-truncated prompt ids and mask [B, P], as the other engines make them."""
        return left_padded(self.tokenizer, prompts, self.max_prompt_length, self.add_special_tokens, self.device)

    def vllm_sampling(self, sampling: SamplingParams, seed: int | None):
        """vLLM's ``SamplingParams`` for one completion: greedy is temperature 0; top_k 0 is off in both."""
        from vllm import SamplingParams as VLLMSamplingParams

        shape = (
            dict(temperature=0.0)
            if sampling.greedy
            else dict(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, seed=seed)
        )
        return VLLMSamplingParams(
            n=1,
            max_tokens=sampling.max_new_tokens,
            min_tokens=sampling.min_new_tokens,
            stop_token_ids=list(self.eos_ids),
            logprobs=0,
            detokenize=False,
            **shape,
        )

    def _batch(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rows: list, n: int) -> RolloutBatch:
        """The :class:`RolloutBatch` of ``rows`` (token ids, log-probs, ended by EOS), right-padded."""
        T = max([len(tokens) for tokens, _, _ in rows] + [1])
        ids = torch.tensor([t + [self.pad_id] * (T - len(t)) for t, _, _ in rows], dtype=torch.long)
        logprobs = torch.tensor([lp + [0.0] * (T - len(lp)) for _, lp, _ in rows], dtype=torch.float32)
        lengths = torch.tensor([len(t) for t, _, _ in rows])
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
        ended = [e for _, _, e in rows]
        # Decode without the EOS token itself: it may not be marked special in every tokenizer.
        texts = self.tokenizer.batch_decode([t[: len(t) - int(e)] for t, _, e in rows], skip_special_tokens=True)
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=ids.to(self.device),
            completion_mask=mask.to(self.device),
            texts=texts,
            finish_reasons=["stop" if e else "length" for e in ended],
            prompt_index=[i for i in range(len(rows) // n) for _ in range(n)],
            logprobs=(logprobs * mask).to(self.device),
        )


def completion_row(completion) -> tuple[list[int], list[float], bool]:
    """(token ids, the sampled tokens' log-probs, ended by an EOS token) of one vLLM ``CompletionOutput``.

    vLLM keeps the stop token (EOS) in ``token_ids`` and finishes with reason "stop" on it; "length"
    is the token budget."""
    tokens = [int(t) for t in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise RuntimeError(
            f"vLLM returned {0 if completion.logprobs is None else len(completion.logprobs)} "
            f"sampling log-probs for {len(tokens)} tokens (logprobs=0 asks for one per token)"
        )
    logprobs = [float(position[token].logprob) for position, token in zip(completion.logprobs, tokens)]
    return tokens, logprobs, completion.finish_reason == "stop"


def row_seeds(sampling: SamplingParams, rows: int) -> list[int]:
    """One vLLM seed per completion: from ``sampling.seed`` and each row's global number
    (``row_offset`` + its index) when the trainer set them, else from torch's random stream (seeded
    by ``train.seed``, and by the evaluation's own seed), so a run samples the same tokens again."""
    seed = getattr(sampling, "seed", None)
    if seed is None:
        seed = int(torch.randint(0, _SEED_MOD, ()).item())
    offset = getattr(sampling, "row_offset", 0)
    return [(seed * 1_000_003 + offset + r) % _SEED_MOD for r in range(rows)]


def policy_model_dir(model) -> Path:
    """The Hugging Face directory the policy was loaded from (``config._name_or_path``)."""
    path = getattr(getattr(model, "config", None), "_name_or_path", None)
    if not path or not (Path(path) / "config.json").is_file():
        raise UsageError(
            f"rollout.engine: vllm starts vLLM from the policy's model directory, but the policy "
            f"names none with a config.json (config._name_or_path = {path!r})"
        )
    return Path(path)


def start_vllm(model_dir: str | Path, gpu_memory_utilization: float):
    """A ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the weights are pushed by
    reference, not serialised to an engine process), bf16, with sleep mode and sampling log-probs."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        tokenizer=str(model_dir),
        dtype="bfloat16",
        gpu_memory_utilization=gpu_memory_utilization,
        enable_sleep_mode=True,
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=True,
        seed=0,
    )
