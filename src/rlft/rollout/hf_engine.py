"""Rollouts through Hugging Face ``generate``: the reference engine, correct everywhere."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from rlft.models.logprobs import token_logprobs
from rlft.rollout.base import RolloutBatch, SamplingParams
from rlft.speed.clock import count, phase

if TYPE_CHECKING:
    from rlft.speed.decode_weights import DecodeWeights


def eos_token_ids(tokenizer, model) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS plus the model's generation EOS ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    return sorted(ids)


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask [N, T] of tokens up to and including the first EOS, and a bool [N] 'ended by EOS'."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    # cumsum counts EOS tokens seen so far; a position is kept while no earlier EOS exists.
    seen_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    mask = (seen_before == 0).long()
    return mask, is_eos.any(dim=1)


def left_padded(
    tokenizer, prompts: list[str], max_length: int, add_special_tokens: bool, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids and mask [B, P], padded and truncated on the left (the newest tokens kept), as
    every engine feeds them to its model."""
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    enc = tokenizer(
        prompts,
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=max_length,
        add_special_tokens=add_special_tokens,
    )
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


class HFGenerateEngine:
    """Samples with ``model.generate`` under the trainer's autocast settings.

    The policy module is shared with the trainer, so every rollout sees the latest weights. With
    ``decode_copy`` and a reduced-precision ``autocast_dtype``, generation runs on a copy of the
    weights in that dtype, refreshed after each optimizer step (:mod:`rlft.speed.decode_weights`).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_prompt_length: int,
        autocast_dtype: torch.dtype | None,
        add_special_tokens: bool = False,
        decode_copy: bool = False,
        fused_decode: bool = True,
    ):
        self.model = model
        self.fused_decode = fused_decode  # NativeEngine: the fused decode where the model allows it
        self.decode_copy = decode_copy and autocast_dtype is not None
        self._copy: DecodeWeights | None = None  # made on first use: the fused decode may not need it
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.autocast_dtype = autocast_dtype
        self.add_special_tokens = add_special_tokens
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def decode_model(self) -> torch.nn.Module:
        """The module to generate with: the policy, or its reduced-precision copy brought up to date."""
        if not self.decode_copy:
            return self.model
        if self._copy is None:
            from rlft.speed.decode_weights import DecodeWeights

            self._copy = DecodeWeights(self.model, self.autocast_dtype)
        with phase("weight_sync"):
            return self._copy.current()

    def release_memory(self) -> None:
        """Between a rollout and the update: free the decode copy's tensors the update's optimizer step
        rewrites (they would be remade for the next generation anyway) until that generation remakes them."""
        if self._copy is not None:
            self._copy.release()

    @contextlib.contextmanager
    def generating(self, model: torch.nn.Module | None = None):
        """Yield the module to generate with (``model``, else :meth:`decode_model`): eval mode, no
        autograd, the engine's autocast and (CPU, when the model's own forward runs) decode-shaped
        linears; the policy's train/eval mode is restored after."""
        linears = model is None
        model = self.decode_model() if model is None else model
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                self.grad_mode(),
                self._autocast(),
                self._decode_linears(model) if linears else contextlib.nullcontext(),
            ):
                yield model
        finally:
            self.model.train(was_training)

    grad_mode = staticmethod(torch.no_grad)

    @staticmethod
    def _decode_linears(model):
        return contextlib.nullcontext()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _generation_config(self, sampling: SamplingParams):
        from transformers import GenerationConfig

        kwargs = dict(
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.min_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        if sampling.greedy:
            return GenerationConfig(do_sample=False, **kwargs)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else None,
            **kwargs,
        )

    @staticmethod
    def _sampled_logprobs(step_logits: tuple[torch.Tensor, ...], tokens: torch.Tensor, sampling: SamplingParams):
        """Log-probs [N, T] of ``tokens`` under the tempered raw logits (one [N, V] per step), before any
        top-k/top-p/min-length processing: the distribution the trainer's forward pass computes."""
        logits = torch.stack(step_logits, dim=1)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        return token_logprobs(logits, tokens[:, : logits.shape[1]], temperature, with_entropy=False)[0]

    def tokenize_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded, left-truncated prompt ids and mask, each [B, P]."""
        return left_padded(self.tokenizer, prompts, self.max_prompt_length, self.add_special_tokens, self.device)

    def run(self, examples: list, sampling: SamplingParams) -> RolloutBatch:
        """One completion per formatted prompt ``example.text`` (n per example)."""
        return self.generate([ex.text for ex in examples], sampling)

    def generate(self, prompts: list[str], sampling: SamplingParams) -> RolloutBatch:
        prompt_ids, prompt_mask = self.tokenize_prompts(prompts)
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)
        with self.generating() as model, phase("decode"):  # prefill included: generate() does not split them
            out = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                generation_config=self._generation_config(sampling),
                output_logits=True,
                return_dict_in_generate=True,
            )
        completion_ids = out.sequences[:, prompt_ids.shape[1] :]
        mask, ended = completion_mask_from_ids(completion_ids, self.eos_ids)
        count("decode_tokens", float(mask.sum()))
        completion_ids = torch.where(mask.bool(), completion_ids, torch.full_like(completion_ids, self.pad_id))
        # Decode without the EOS token itself: it may not be marked special in every tokenizer.
        text_lengths = (mask.sum(-1) - ended.long()).tolist()
        texts = self.tokenizer.batch_decode(
            [ids[:n] for ids, n in zip(completion_ids, text_lengths)], skip_special_tokens=True
        )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=mask,
            texts=texts,
            finish_reasons=["stop" if e else "length" for e in ended.tolist()],
            prompt_index=[i for i in range(len(prompts)) for _ in range(sampling.n)],
            logprobs=self._sampled_logprobs(out.logits, completion_ids, sampling) * mask,
        )
