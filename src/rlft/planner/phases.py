"""The bytes each phase of a training step keeps, per kind of job.

A step goes through phases that never overlap in time: an RL step samples (``rollout``), scores
the samples under the policy and the reference (``scoring``) and updates (``update``); every
kind updates; evaluation generates between steps. Each phase holds what the run keeps all the
time (weights, optimizer moments, the reference, decode copies) plus what only it allocates
(the KV cache, one micro-batch's activations, logits). The peak is the largest phase.

Every term is an upper bound for the worst step the config allows: every completion runs to
``max_new_tokens`` and every row of a micro-batch is as long as the longest prompt. The
activations' per-token constants are the device's (:class:`Allowance`): a CPU's fitted to measured
peak resident sets, a GPU's counted from the tensors its update keeps (docs/operations.md has both).

What a kind needs is its registry entry's ``memory`` (:data:`rlft.config.schema.JOB_KINDS`), so
a new kind of job says how it uses memory where it is declared.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlft.planner.shape import ModelShape

Phases = dict[str, dict[str, int]]

# Activation bytes one token keeps for the backward, per decoder layer, in units of the hidden size: hidden-sized
# tensors in the compute dtype (ACT_HIDDEN) and the MLP's intermediate-sized ones (gate, its activation, up, their
# product: ACT_INTER), beside fp32 hidden-sized ones (the residual stream, the norms' inputs and outputs: autocast
# casts matmul inputs, it does not keep them in bf16), whose count is the device's (Allowance).
ACT_HIDDEN, ACT_INTER = 1, 4
# Under selective recomputation (rlft.models.checkpointing) a layer keeps its fp32 input and, in the compute dtype,
# its matmuls' outputs: q, attention, o and down (hidden-sized), k and v (the kv width), gate and up
# (intermediate-sized), beside what the device's allowance adds.
SEL_HIDDEN = 4


@dataclass(frozen=True)
class Allowance:
    """What the activation terms count beside the tensors they name, by how a device's peak is measured.

    act_fp32_hidden / sel_fp32_hidden / ckpt_fp32_hidden: fp32 hidden units a layer and a token keeps with nothing
    recomputed, under selective recomputation, and under full checkpointing; lora_hidden: compute-dtype hidden units
    a LoRA adapter on every linear adds with nothing recomputed; margin: the activations' total is multiplied by
    this, by compute dtype in bytes."""

    act_fp32_hidden: int
    sel_fp32_hidden: int
    ckpt_fp32_hidden: int
    lora_hidden: int
    margin: dict[int, float]


# A CPU's peak is its resident set, which also keeps what glibc's heap did not hand back: fitted on measured peaks
# (docs/operations.md has the tables). Nothing recomputed: 79 bytes a hidden unit in bf16 and 101 in fp32 on
# SmolLM2-135M (16 x 281 tokens); a LoRA adapter on every linear keeps each adapted input once more (84 in bf16).
# Full checkpointing: the fp32 input measured at 25 bytes a unit (the rotary tables beside it), rounded up. Selective:
# the input's 1 unit and 5 more for what the backward holds beside the kept tensors and the heap's retained memory,
# the smallest that kept benchmarks/memory_estimate.py's selective cases over their peaks run after run (4.69-4.99 GiB
# measured against 4.90 with 5, 2026-12-06, night). The margins: the smallest that kept every case at or above it.
CPU_ALLOWANCE = Allowance(
    act_fp32_hidden=15, sel_fp32_hidden=6, ckpt_fp32_hidden=7, lora_hidden=3, margin={2: 1.15, 4: 1.25}
)
# A GPU's peak is its caching allocator's: the live tensors, and the blocks it keeps reserved beside them. The live
# tensors were counted on a CPU through the update's GPU path (PyTorch's SDPA, whose fused kernel keeps what a GPU's
# keeps; `RLFT_NATIVE_KERNELS=0 python benchmarks/recompute.py --no-time`, bf16, 2026-12-07): selective keeps exactly
# the fp32 input and the matmuls' outputs above, 32.0 / 24.0 / 24.0 / 27.0 bytes a unit on SmolLM2-1.7B's, -360M's
# and -135M's layers and Llama-3-8B's with LoRA r=16, as this counts them with one fp32 unit; nothing recomputed kept
# 69.2 / 58.7 / 58.9 (4 x 8.8-8.9 fp32 units beside the compute-dtype terms: 9) and 57.8 with LoRA (no more than
# without: 0); full checkpointing 4.0 (the input). The margin stands for the allocator's reserve and the backward's
# transient tensors, which no CPU measures: it is reasoned (a caching allocator's peak reserve is typically 5-15 %
# over its live tensors), to be refit on `scripts/gpu_scale.sh`'s allocated and reserved peaks.
GPU_ALLOWANCE = Allowance(
    act_fp32_hidden=9, sel_fp32_hidden=1, ckpt_fp32_hidden=1, lora_hidden=0, margin={2: 1.4, 4: 1.4}
)
ALLOWANCES = {"cpu": CPU_ALLOWANCE, "cuda": GPU_ALLOWANCE}
HEAD_CHUNK_ELEMENTS = 1 << 24  # rlft.speed.head_logprobs: logits computed at a time
HEAD_CHUNK_COPIES = 3  # the chunk's logits, probabilities and their gradient
HEAD_KEPT_PROBS_BYTES = 512 * 2**20  # rlft.models.logprobs.KEPT_PROBS_BYTES: probabilities kept up to this size
DECODE_LOGIT_COPIES = 4  # a decode step's logits, fp32 copy, probabilities and sampling scratch
KV_GROWTH = 2  # a cache grown a block at a time briefly holds the old and the new one


@dataclass(frozen=True)
class Geometry:
    """What one step of a run processes, worked out from the config and the data.

    rows: sequences a rollout samples (prompts x completions; pairs x 2 for preference jobs);
    prompts: distinct prompts per rollout; prompt_tokens: the longest prompt; new_tokens: the
    most a completion generates (0: no generation); micro_rows: sequences per forward/backward;
    eval_rows / eval_new_tokens: the evaluation's generation batch; compute_bytes: 2 under bf16
    autocast, 4 in fp32; recompute: what the update's layers recompute in the backward (``off``,
    ``selective``, ``full``: :mod:`rlft.models.checkpointing`); device_kind: ``cpu`` or ``cuda``, whose
    peaks are measured differently (:data:`ALLOWANCES`)."""

    rows: int
    prompts: int
    prompt_tokens: int
    new_tokens: int
    micro_rows: int
    compute_bytes: int
    recompute: str
    eval_rows: int = 0
    eval_new_tokens: int = 0
    group: int = 1
    device_kind: str = "cpu"

    @property
    def allowance(self) -> Allowance:
        return ALLOWANCES.get(self.device_kind, CPU_ALLOWANCE)

    @property
    def seq(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def forward_tokens(self) -> int:
        """Positions one forward/backward runs: a group's completions share one pass over their prompt
        (:func:`rlft.models.logprobs.grouped_completion_logprobs`), so a micro-batch is its completions
        plus one prompt per group it touches; rows without completions are whole."""
        if not self.new_tokens:
            return self.micro_rows * self.seq
        return self.micro_rows * self.new_tokens + -(-self.micro_rows // self.group) * self.prompt_tokens

    @property
    def scored_tokens(self) -> int:
        """Positions whose log-probs the head computes: the completions (every position of a row
        without one)."""
        return self.micro_rows * (self.new_tokens or self.seq)


def _layer_per_token(shape: ModelShape, compute_bytes: int, allowance: Allowance) -> int:
    """What one decoder layer keeps a token when it keeps everything (or replays its forward)."""
    h, inter = shape.hidden, shape.intermediate
    lora = allowance.lora_hidden * h if shape.trainable < shape.params else 0
    return 4 * allowance.act_fp32_hidden * h + (ACT_HIDDEN * h + lora + ACT_INTER * inter) * compute_bytes


def activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, recompute: str, allowance: Allowance) -> int:
    """Activations ``tokens`` positions keep for the backward through the decoder layers."""
    h, inter, kv = shape.hidden, shape.intermediate, shape.kv_heads * shape.head_dim
    layer = _layer_per_token(shape, compute_bytes, allowance)
    selective = 4 * allowance.sel_fp32_hidden * h + (SEL_HIDDEN * h + 2 * kv + 2 * inter) * compute_bytes
    per_token = {
        "off": shape.layers * layer,
        "selective": shape.layers * selective + layer,
        "full": shape.layers * 4 * allowance.ckpt_fp32_hidden * h + layer,
    }[recompute]
    return int(allowance.margin[compute_bytes] * tokens * per_token)


def head_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> int:
    """The LM head's log-probs over ``tokens`` positions: the final hidden states, a few chunks of
    fp32 logits, and the probabilities in the compute dtype where they are small enough to be kept
    for the backward (which turns them into their gradient in place)."""
    chunk = min(HEAD_CHUNK_ELEMENTS, tokens * shape.vocab)
    probs = tokens * shape.vocab * compute_bytes
    kept = probs if probs <= HEAD_KEPT_PROBS_BYTES else 0
    return tokens * shape.hidden * (4 + compute_bytes) + HEAD_CHUNK_COPIES * 4 * chunk + kept


def forward_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> int:
    """A forward without gradients over ``tokens`` positions: the largest layer's intermediates
    (gate, up and their product; q/k/v and the residual stream)."""
    return tokens * (3 * shape.intermediate + 6 * shape.hidden) * max(compute_bytes, 4)


def kv_bytes(shape: ModelShape, rows: int, positions: int, cache_bytes: int) -> int:
    return KV_GROWTH * rows * positions * shape.kv_bytes_per_token * cache_bytes


def generation_bytes(
    shape: ModelShape,
    rows: int,
    prompts: int,
    prompt_tokens: int,
    new_tokens: int,
    cache_bytes: int,
    graphed: bool = False,
) -> dict[str, int]:
    """A generation batch: its KV cache, the prefill of the distinct prompts, a decode step's logits.

    ``graphed``: the GPU's graphed decode (:mod:`rlft.speed.graphed_rows`), which caches each prompt
    once for its group and allocates the completions' cache once, at its full length."""
    cache = (
        (prompts * prompt_tokens + rows * new_tokens) * shape.kv_bytes_per_token * cache_bytes
        if graphed
        else kv_bytes(shape, rows, prompt_tokens + new_tokens, cache_bytes)
    )
    return {
        "kv cache": cache,
        "prefill": forward_bytes(shape, prompts * prompt_tokens, cache_bytes),
        "logits": DECODE_LOGIT_COPIES * 4 * rows * shape.vocab,
    }


def trained_bytes(shape: ModelShape, frozen_linear_bytes: int = 4) -> dict[str, int]:
    """What a trained model keeps between steps: fp32 master weights and AdamW's two fp32 moments
    (allocated at the first optimizer step, kept from then on). ``frozen_linear_bytes``: what a LoRA
    base's Linear weights take a parameter (the compute dtype's, :func:`rlft.models.precision.place_weights`)."""
    frozen_linear = shape.untied_linear_params - shape.trainable if shape.trainable < shape.params else 0
    weights = 4 * shape.params - (4 - frozen_linear_bytes) * frozen_linear
    return {"weights": weights, "optimizer": 8 * shape.trainable}


def update_bytes(shape: ModelShape, g: Geometry, head: bool = True, one_pass: bool = False) -> dict[str, int]:
    """A backward over one micro-batch, gradients accumulating: gradients (fp32, trainable
    parameters), the micro-batch's activations, and the head's log-prob buffers (``head``).

    ``one_pass``: the optimizer step's only forward/backward, on a GPU. Its gradients do not exist at
    the forward's end (they are freed after every step, :func:`rlft.trainer.optim.clipped_step`) and
    the backward allocates them layer by layer as it frees the activations, so the pass peaks at
    the larger of the forward's end (every activation, and the LM head's weight gradient, the
    backward's first) and the backward's end (every gradient and one layer's forward): the gradient
    term is what the backward's end holds beyond the forward's. Passes after a first one run with
    the gradients already there. A CPU's peak is its resident set, which keeps what glibc's heap could
    not reuse: there the activations and gradients were measured to coexist
    (``benchmarks/memory_estimate.py``'s one-pass cases), so the caller leaves ``one_pass`` off."""
    out = {"activations": activation_bytes(shape, g.forward_tokens, g.compute_bytes, g.recompute, g.allowance)}
    if head:
        out["logits"] = head_bytes(shape, g.scored_tokens, g.compute_bytes)
    if g.compute_bytes == 2 and g.recompute == "off":  # autograd keeps each weight's bf16 cast for the backward
        out["autocast weights"] = 2 * shape.linear_params
    gradients = 4 * shape.trainable
    if one_pass:
        last_layer = int(
            g.allowance.margin[g.compute_bytes]
            * g.forward_tokens
            * _layer_per_token(shape, g.compute_bytes, g.allowance)
        )
        head_gradient = 4 * shape.vocab * shape.hidden if shape.trainable == shape.params else 0
        gradients = max(head_gradient, gradients + last_layer - sum(out.values()))
    return {"gradients": gradients, **out}


def scoring_bytes(shape: ModelShape, g: Geometry) -> dict[str, int]:
    """Log-probs of a micro-batch without gradients (old policy, reference)."""
    return {
        "activations": forward_bytes(shape, g.forward_tokens, g.compute_bytes),
        "logits": head_bytes(shape, g.scored_tokens, g.compute_bytes),
    }


def reference_bytes(shape: ModelShape, compute_bytes: int, lora: bool) -> int:
    """The frozen KL reference: none under LoRA (the base with the adapter off), else a copy with its
    Linear weights in the compute dtype and everything else in fp32."""
    if lora:
        return 0
    if compute_bytes == 2:
        return 2 * shape.linear_params + 4 * (shape.params - shape.untied_linear_params)
    return 4 * shape.params


def unmerged_decode_bytes(shape: ModelShape, compute_bytes: int, packed: bool, base_bytes: int) -> int:
    """A LoRA policy's fused decode with its adapters unmerged (``rollout.decode_copy: false``, or fp32;
    rlft.speed.lora_decode): the adapters' factors in the compute dtype, their B blocks with the zeros around
    them (at most twice the adapter's parameters); with ``packed`` (a CPU in bf16), or a base not stored in bf16
    (``base_bytes`` 4: fsdp2), a bf16 copy of every Linear, made once; else (a GPU, the bf16 base read as it
    is) a tied LM head's bf16 copy. None of it is freed for the update."""
    factors = 2 * compute_bytes * shape.trainable
    if compute_bytes != 2:
        return factors
    if packed or base_bytes != 2:
        return factors + 2 * shape.linear_params
    return factors + (2 * shape.vocab * shape.hidden if shape.tied_embeddings else 0)


LORA_MERGE_BYTES = 8  # an adapted Linear's merged weight made at full precision: the fp32 delta and the fp32 sum


def lora_merge_bytes(shape: ModelShape, targets: list[str] | str) -> int:
    """Refreshing a merged LoRA decode copy (rlft.speed.decode_weights) makes each adapted Linear's weight at
    full precision, one Linear at a time, before the copy rounds it: the adapters' fp32 delta beside its fp32
    sum with the base, 8 bytes a parameter of the largest adapted Linear (0.44 GiB at Llama-3-8B's MLP). It
    happens before the prefill, so it never meets the generation's own tensors. ``targets``: the LoRA's
    ``target_modules`` (a name PEFT matches otherwise is taken to be the largest Linear)."""
    q, kv, mlp = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    sizes = {"q_proj": q, "o_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": mlp, "up_proj": mlp, "down_proj": mlp}
    if isinstance(targets, str):  # 'all-linear' (every Linear but the head), or a pattern
        widest = max(sizes.values())
    else:
        widest = max((sizes.get(t, max(sizes.values())) for t in targets if t != "lm_head"), default=0)
        widest = max(widest, shape.vocab if "lm_head" in targets else 0)
    return LORA_MERGE_BYTES * shape.hidden * widest


def decode_copy_bytes(shape: ModelShape, compute_bytes: int, lora: bool, packed: bool, shared: int = 0) -> int:
    """The rollout's bf16 weights. ``packed``: a CPU's fused decode, which multiplies packed copies of
    every Linear (made straight from a full policy; a LoRA policy is first merged into a plain bf16
    module, which is packed in turn). Elsewhere (a GPU) the bf16 module copy alone, LoRA merged into
    it, embeddings and norms read from the policy's own tensors, as are Linear weights the policy already
    stores in bf16 (``shared`` bytes: a LoRA base's LM head no adapter changes). Nothing in fp32."""
    if compute_bytes != 2:
        return 0
    linear = 2 * shape.linear_params
    if not packed:
        return linear - shared
    return linear + (linear - shared + 4 * (shape.params - shape.untied_linear_params) if lora else 0)
