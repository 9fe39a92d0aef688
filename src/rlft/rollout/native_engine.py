"""The default rollout engine: shared-prompt prefill and a decode loop that drops finished rows.

Each prompt is prefilled once and its KV cache is repeated for its ``n``
completions (Hugging Face ``generate`` prefills every copy); sequences that
emitted an end-of-sequence token leave the batch, so later decode steps only
pay for rows still generating.
"""

from __future__ import annotations

import torch

from rlft.models.fast_linear import weight_first_linears
from rlft.models.logprobs import cache_kwargs, position_ids_from_mask
from rlft.rollout.base import RolloutBatch, SamplingParams
from rlft.rollout.hf_engine import HFGenerateEngine
from rlft.rollout.sampling import sample_next


class NativeEngine(HFGenerateEngine):
    """Same interface and tokenisation as :class:`HFGenerateEngine`; a faster decode loop."""

    # inference_mode skips autograd's per-op bookkeeping (version counters, views), which adds up
    # over ~200 small ops per decode step; its tensors are cloned before leaving generate().
    grad_mode = staticmethod(torch.inference_mode)

    def generate(self, prompts: list[str], sampling: SamplingParams) -> RolloutBatch:
        prompt_ids, prompt_mask = self.tokenize_prompts(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.grad_mode(), self._autocast(), weight_first_linears(self.model):
                decoded = self._decode(prompt_ids, prompt_mask, sampling)
        finally:
            self.model.train(was_training)
        tokens, logprobs, lengths, ended = (t.clone() for t in decoded)  # normal tensors again
        n = sampling.n
        steps = torch.arange(tokens.shape[1], device=tokens.device)
        mask = (steps[None, :] < lengths[:, None]).long()
        text_lengths = (lengths - ended.long()).tolist()
        texts = self.tokenizer.batch_decode([row[:k] for row, k in zip(tokens, text_lengths)], skip_special_tokens=True)
        return RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(n, 0), prompt_mask=prompt_mask.repeat_interleave(n, 0),
            completion_ids=tokens, completion_mask=mask, texts=texts,
            finish_reasons=["stop" if e else "length" for e in ended.tolist()],
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            logprobs=logprobs * mask,
        )

    def _decode(self, prompt_ids, prompt_mask, sampling: SamplingParams):
        """Returns tokens [N, T] (pad after the end), logprobs [N, T], lengths [N] (incl. EOS), ended [N] bool."""
        from transformers import DynamicCache

        n, T, device = sampling.n, sampling.max_new_tokens, prompt_ids.device
        cache = DynamicCache()
        logits = self._last_logits(cache, prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask))
        for layer in cache.layers:
            layer.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, 0)
        attn = prompt_mask.repeat_interleave(n, 0)
        N = attn.shape[0]
        positions = attn.sum(-1)
        alive = torch.arange(N, device=device)
        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(N, T, device=device)
        lengths = torch.full((N,), T, dtype=torch.long, device=device)
        ended = torch.zeros(N, dtype=torch.bool, device=device)
        eos = torch.tensor(self.eos_ids, device=device)
        for t in range(T):
            tok, lp = sample_next(logits, sampling, eos if t < sampling.min_new_tokens else None)
            tokens[alive, t], logprobs[alive, t] = tok, lp
            done = torch.isin(tok, eos)
            lengths[alive[done]], ended[alive[done]] = t + 1, True
            keep = (~done).nonzero().squeeze(-1)
            if t == T - 1 or keep.numel() == 0:
                break
            if keep.numel() < alive.numel():
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                alive, attn, positions, tok = alive[keep], attn[keep], positions[keep], tok[keep]
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)
            logits = self._last_logits(cache, tok[:, None], attn, positions[:, None])
            positions = positions + 1
        return tokens, logprobs, lengths, ended

    def _last_logits(self, cache, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Next-token logits [B, V] after ``input_ids`` [B, L]; extends ``cache`` in place."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          logits_to_keep=1, **cache_kwargs(cache)).logits[:, -1]
