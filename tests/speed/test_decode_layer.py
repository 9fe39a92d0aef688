"""The fused decode's layers compiled by torch.compile (rollout.compile_decode), against the same layers run
as PyTorch ops: on the CPU (Inductor's C++ backend) here, and captured in a CUDA graph where a GPU is."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import rlft.speed.decode_layer as decode_layer
from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.rollout import NativeEngine, SamplingParams
from rlft.rollout.sampling import SAMPLE_NEXT_COMPILED
from rlft.speed.fused_decode import FusedDecoder
from rlft.speed.graphed_rows import _ENDS_COMPILED, GraphedRows

from .test_fused_decode import _policy
from .test_graphed_rows import _generate, _graphed_everywhere

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Inductor's own, on a CPU without a GPU


def _compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_the_compiled_layers_decode_what_the_eager_layers_decode(tmp_path, monkeypatch):
    """A whole rollout through the GPU's fixed batch (run eagerly here): five attention windows, a group's
    prompt cached once, rows ending at mixed lengths. The compiled layers, draw and ends give the same
    tokens, and one compilation of each function serves every layer, window, step and later batch."""
    from rlft.models.tiny import build_tiny_model_dir

    model, tok = _policy(build_tiny_model_dir(tmp_path / "model", hidden_size=256, num_layers=4))
    sampling = SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3)
    out, made = {}, {}
    # the compiled functions are the process's: forget what another test's rollouts compiled, or they
    # serve this one's and the count below is of fewer new graphs
    torch._dynamo.reset()
    before = _compiled_graphs()
    for compiled in (False, True):
        monkeypatch.setattr(GraphedRows, "WINDOW", 8)
        out[compiled], _, made[compiled] = _generate(
            model, tok, monkeypatch, True, sampling, {0: 1, 4: 3, 5: 20}, compile_decode=compiled
        )
    rows = made[True][0]
    assert rows.fused.compiled and not made[False][0].fused.compiled
    assert len(rows.windows) == 5 and len(rows.fused.layers) == 4
    for fn in (*decode_layer._COMPILED, SAMPLE_NEXT_COMPILED, _ENDS_COMPILED):
        assert fn.compiled is not None and not fn.failed, fn.what
    # five functions (the layer's two halves, the draw, the rows' ends), each compiled once, with
    # dynamic shapes; the second half again where the window reaches the cache's capacity (its keys' slice is
    # then contiguous), and on a CPU the draw again for the step's logits, which the CPU's weight-first head
    # leaves transposed. A compilation per layer would have made four of each half.
    assert 5 <= _compiled_graphs() - before <= 7, _compiled_graphs() - before
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert out[True].finish_reasons == out[False].finish_reasons
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    # That first rollout had as many prompts as completions each (as the benchmark's 8 x 8): batches of other
    # proportions (a resampled subset of the groups, more completions each) reuse its compilations, rather
    # than compile anew (seconds each on a GPU; past Dynamo's limit the decode would run eagerly)
    _graphed_everywhere(monkeypatch, graphs=False)
    monkeypatch.setattr(GraphedRows, "WINDOW", 8)
    engine = NativeEngine(
        model, tok, max_prompt_length=64, autocast_dtype=None, native_kernels=False, compile_decode=True
    )
    words = ["a", "bb", "ccc dd", "e", "ff gg hh", "i"]
    before = _compiled_graphs()
    for groups, n in ((5, 3), (2, 4), (6, 2)):
        engine.generate(words[:groups], SamplingParams(max_new_tokens=40, n=n, temperature=0.9, seed=groups))
    assert _compiled_graphs() == before, _compiled_graphs() - before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_compiled_step_gives_the_eager_steps_logits(wide_head_model_dir, dtype):
    """One step of the GPU's form (the shared prompt cache, the column on the device) over a decoder
    of the weights as they are, as the bf16 module copy is on a GPU; in bf16 Inductor may keep a fused
    intermediate in fp32 where the eager ops round it, so there the logits agree to bf16's precision."""
    model, _ = _policy(wide_head_model_dir)
    model = model.to(dtype)
    decoders = [FusedDecoder(model, compiled=c) for c in (False, True)]
    assert decoders[1].compiled
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    n, logits = 2, []
    with torch.inference_mode():
        for fused in decoders:
            prompt = fused.new_cache(2, 4)
            fused.prefill(ids, mask, prompt)
            kv = fused.new_cache(4, 12)
            kv.reserve(12)
            positions, column = mask.sum(-1).repeat_interleave(n), torch.tensor([0])
            steps = []
            for token in (3, 4, 5):
                tokens = torch.tensor([token, token + 10, token + 20, token + 30])
                steps.append(fused.step_at(tokens, positions, kv, column, window=8, prompt=prompt))
                positions, column = positions + 1, column + 1
            logits.append(torch.stack(steps))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(logits[1], logits[0], atol=tol, rtol=tol)
    assert logits[0].std() > 0.1  # the logits are not a constant the two could agree on by accident


def test_a_compiled_layer_that_cannot_compile_runs_eagerly_with_one_warning(monkeypatch, caplog):
    """Inductor's C++ compiler missing (and nothing cached): the layer runs as PyTorch ops, said once."""
    monkeypatch.setattr(decode_layer, "_COMPILED", None)  # fresh torch.compile objects: Dynamo traces anew
    layer_in, _ = decode_layer.layer_steps(compiled=True)
    h, cos, sin = torch.randn(2, 8), torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    qkv = ((torch.randn(16, 8),), None, None)
    caches = [torch.zeros(2, 1, 5, 4) for _ in range(4)]  # keys and values [B, KVH, A, D], twice
    # config.patch, not monkeypatch: undoing a config module's setattr deletes the key for later tests
    broken = torch._inductor.config.patch({"force_disable_caches": True, "cpp.cxx": ("/nonexistent/c++",)})
    with caplog.at_level(logging.WARNING, logger="rlft"), broken:
        got = [layer_in(h, qkv, cos, sin, 2, 0, caches[0], caches[1], 3) for _ in range(2)]
    assert layer_in.failed
    expected = decode_layer.layer_in(h, qkv, cos, sin, 2, 0, caches[2], caches[3], 3)
    for q, grouped in got:
        assert grouped is None and expected[1] is None  # no prompt cache: no grouped queries
        assert torch.equal(q, expected[0])
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0][:, :, 3].abs().sum() > 0 and caches[0][:, :, :3].abs().sum() == 0  # column 3 alone
    warnings = [r.getMessage() for r in caplog.records if "could not be compiled" in r.getMessage()]
    assert len(warnings) == 1 and "compile_decode" in warnings[0], warnings


def test_more_variants_than_dynamos_recompile_limit_run_eagerly_with_one_warning(caplog):
    """Each sampling setting the draw branches on (greedy, top-k, top-p, a suppressed EOS) is a variant of
    the compiled draw; past the limit, fullgraph raises a plain Exception, which must fall back as any
    other failed compilation does, not end the rollout."""
    from rlft.speed.compiled import Compiled

    # Dynamo's tracing alone (backend "eager"): the limit is Dynamo's, whatever compiles the graphs
    draw = Compiled(lambda x, greedy: x.argmax(-1) if greedy else (x * 2).argmin(-1), "the draw", backend="eager")
    x = torch.randn(3, 5)
    # config.patch, not monkeypatch: the config module's undo through setattr would delete the key
    with caplog.at_level(logging.WARNING, logger="rlft"), torch._dynamo.config.patch(recompile_limit=1):
        got = [draw(x, greedy) for greedy in (True, False, True)]
    assert draw.failed
    assert [g.tolist() for g in got] == [x.argmax(-1).tolist(), x.argmin(-1).tolist(), x.argmax(-1).tolist()]
    warnings = [r.getMessage() for r in caplog.records if "the draw could not be compiled" in r.getMessage()]
    assert len(warnings) == 1 and "FailOnRecompileLimitHit" in warnings[0], warnings


def test_a_packed_cpu_decoder_keeps_its_packed_matmuls(wide_head_model_dir):
    """A packed copy is multiplied by oneDNN or rlft's kernel, which Inductor does not fuse: not compiled."""
    model, _ = _policy(wide_head_model_dir)
    assert not FusedDecoder(model, pack_dtype=torch.float32, compiled=True).compiled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled layers inside a CUDA graph need a GPU")
def test_on_cuda_the_captured_compiled_decode_samples_what_the_captured_eager_one_samples(
    wide_head_model_dir, monkeypatch
):
    cuda = torch.device("cuda")
    model = load_policy(
        ModelConfig(path=str(wide_head_model_dir), dtype="bf16", device="cuda"), cuda, model_dir=wide_head_model_dir
    )
    tok = load_tokenizer(wide_head_model_dir)
    sampling = SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3, min_new_tokens=2)
    out, made = {}, {}
    # (compiled, captured): the captured compiled token against the same compiled token run eagerly, and
    # against the uncompiled eager one
    for run in [(True, False), (True, True), (False, False)]:
        monkeypatch.setattr(GraphedRows, "WINDOW", 16)  # 40 tokens cross three windows
        out[run], _, made[run] = _generate(
            model,
            tok,
            monkeypatch,
            True,
            sampling,
            graphs=run[1],
            autocast_dtype=torch.bfloat16,
            decode_copy=True,
            compile_decode=run[0],
        )
    assert made[True, True][0].graph is not None and made[True, True][0].fused.compiled
    compiled = (*decode_layer._COMPILED, SAMPLE_NEXT_COMPILED, _ENDS_COMPILED)
    assert not [c.what for c in compiled if c.failed]  # none fell back to eager unseen
    # token 0 comes from the (uncompiled) prefill's logits and the integer uniforms: the same draw in all three
    assert torch.equal(out[True, True].completion_ids[:, 0], out[False, False].completion_ids[:, 0])
    assert torch.equal(out[True, True].completion_ids, out[True, False].completion_ids)
    m = out[True, True].completion_mask.bool()
    torch.testing.assert_close(out[True, True].logprobs[m], out[True, False].logprobs[m], atol=1e-5, rtol=1e-5)
    # the first compiled step has the uncompiled one's context (the prefill is not compiled): in bf16 a fused
    # intermediate may stay fp32, so its log-probs agree to bf16's precision where the same token was drawn
    first = out[True, True].completion_ids[:, 1] == out[False, False].completion_ids[:, 1]
    assert first.float().mean() > 0.5
    lp = [out[run].logprobs[first, 1] for run in [(True, True), (False, False)]]
    torch.testing.assert_close(lp[0], lp[1], atol=3e-2, rtol=3e-2)
