"""Speed: everything rlft does to make a step faster than the plain PyTorch path, in one place.

Each module is an optimisation with a plain path beside it that computes the same thing, so a
newcomer can read the loop without reading this package, and a test compares the two paths.

* :mod:`rlft.speed.fused_decode` -- Llama-family prefill and decode in one call per token, over a
  static KV cache (:mod:`rlft.speed.static_kv`) and weight-first thin matmuls
  (:mod:`rlft.speed.fast_linear`)
* :mod:`rlft.speed.decode_weights` -- the bf16 / packed copies the rollout decodes from, remade only
  where the optimizer changed them (:mod:`rlft.speed.change_watch`)
* :mod:`rlft.speed.kernels` -- native CPU kernels (C, built on first use): bf16 GEMM, attention,
  RMSNorm, the fused decode layer loop
* :mod:`rlft.speed.attention` -- the update's attention over grouped prompts;
  :mod:`rlft.speed.head_logprobs` -- the LM head's log-probs without [n, V] fp32 logits
* :mod:`rlft.speed.graphed_rows` -- CUDA graphs for the decode step on a GPU
* :mod:`rlft.speed.threads` -- one compute thread per usable physical core;
  :mod:`rlft.speed.allocator` -- glibc malloc settings that keep freed memory mapped between steps
* :mod:`rlft.speed.clock` -- where a step's time goes (``time/<phase>`` in metrics.jsonl)

It sits below :mod:`rlft.models` and :mod:`rlft.rollout` (which call it) and imports neither.
"""
