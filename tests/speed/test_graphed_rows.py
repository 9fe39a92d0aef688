"""The GPU decode's rows (a CUDA graph per rollout): the static step it captures, checked on the CPU
against the decode whose finished rows leave the batch; the capture itself where a CUDA GPU is."""

from __future__ import annotations

import pytest
import torch

import rlft.rollout.native_engine as native_engine
from rlft.config.algorithm import RolloutConfig
from rlft.config.schema import ModelConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.rollout import NativeEngine, SamplingParams
from rlft.speed.clock import CLOCK
from rlft.speed.fused_decode import FusedDecoder
from rlft.speed.graphed_rows import GraphedRows

from .test_fused_decode import PROMPTS, _forward_logprobs, _policy, _scripted_eos


def _graphed_everywhere(monkeypatch, graphs: bool) -> list[GraphedRows]:
    """Make the engine take GraphedRows on any device (captured only if ``graphs``); returns the rows it made."""
    made = []

    def rows(*args, **kwargs):
        made.append(GraphedRows(*args, graphs=graphs, **kwargs))
        return made[-1]

    monkeypatch.setattr(native_engine, "graphs_apply", lambda device: True)
    monkeypatch.setattr(native_engine, "GraphedRows", rows)
    return made


def test_the_static_step_decodes_what_the_dropping_rows_decode(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    out, counts = {}, {}
    for graphed in (False, True):
        made = _graphed_everywhere(monkeypatch, graphs=False) if graphed else []
        monkeypatch.setattr(GraphedRows, "WINDOW", 8)  # attention's window grows several times in 40 tokens
        CLOCK.reset()
        engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None, native_kernels=False)
        # rows end at different steps: dropped from the batch on one side, kept (masked) on the other
        monkeypatch.setattr(native_engine, "sample_next", _scripted_eos(engine.eos_ids[0], {0: 1, 4: 3, 5: 20}))
        out[graphed] = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3))
        counts[graphed] = dict(CLOCK.counts)
        monkeypatch.undo()
    assert len(made) == 1 and made[0].live is not None and made[0].live.numel() < 9
    rows = made[0]
    assert rows.kv.allocated == rows.kv.capacity == 40  # the whole cache at once: the graph holds its address
    assert rows.prompt.k.shape[1] == len(PROMPTS)  # a prompt's keys and values once for its group of 3
    # the window follows the filled columns up, a multiple of 8 at a time, never past them by 8
    assert rows.windows == [8, 16, 24, 32, 40][: len(rows.windows)] and len(rows.windows) >= 3, rows.windows
    assert rows.kv.length <= rows.windows[-1] < rows.kv.length + 8
    for graphed in (False, True):  # what a step read: at least what its live rows attend to
        assert 0 < counts[graphed]["decode_kv_needed_bytes"] <= counts[graphed]["decode_kv_bytes"]
    # the prompts read once a group instead of once a row
    assert counts[True]["decode_kv_needed_bytes"] < counts[False]["decode_kv_needed_bytes"]
    lengths = out[True].completion_mask.sum(-1).tolist()
    assert lengths[0] == 2 and lengths[4] == 4 and len(set(lengths)) >= 4 and max(lengths) > 16, lengths
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        out[True].logprobs[m], _forward_logprobs(model, out[True], False, 0.9)[m], atol=1e-5, rtol=1e-5
    )


def test_step_at_writes_the_column_it_is_given_as_step_writes_its_own(wide_head_model_dir):
    model, _ = _policy(wide_head_model_dir)
    fused = FusedDecoder(model)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    caches = [fused.new_cache(2, 12) for _ in range(2)]
    with torch.no_grad():
        for kv in caches:
            fused.prefill(ids, mask, kv)
        caches[1].reserve(12)
        positions, column = mask.sum(-1), torch.tensor([4])
        for token in (3, 4, 5):
            tokens = torch.tensor([token, token + 10])
            a = fused.step(tokens, positions, caches[0])
            b = fused.step_at(tokens, positions, caches[1], column, window=int(column) + 1)
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
            positions, column = positions + 1, column + 1
    n = caches[0].length
    assert torch.equal(caches[0].valid[:, :n], caches[1].valid[:, :n]) and not caches[1].valid[:, n:].any()
    torch.testing.assert_close(caches[0].k[:, :, :, :n], caches[1].k[:, :, :, :n], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(caches[0].v[:, :, :, :n], caches[1].v[:, :, :, :n], atol=1e-6, rtol=1e-6)


def test_cuda_graphs_is_a_native_engine_option():
    assert RolloutConfig().engine_options() == {"cuda_graphs": True}
    assert RolloutConfig(cuda_graphs=False).engine_options() == {"cuda_graphs": False}
    assert RolloutConfig(engine="hf").engine_options() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_captured_graph_decodes_what_the_eager_static_step_decodes(wide_head_model_dir, monkeypatch, dtype):
    cuda = torch.device("cuda")
    model = load_policy(
        ModelConfig(path=str(wide_head_model_dir), dtype=dtype, device="cuda"), cuda, model_dir=wide_head_model_dir
    )
    tok = load_tokenizer(wide_head_model_dir)
    autocast = torch.bfloat16 if dtype == "bf16" else None
    out, made = {}, {}
    for graphs in (False, True):
        made[graphs] = _graphed_everywhere(monkeypatch, graphs)
        engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=autocast, decode_copy=True)
        monkeypatch.setattr(native_engine, "sample_next", _scripted_eos(engine.eos_ids[0], {0: 1, 4: 3, 5: 20}))
        out[graphs] = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3))
        monkeypatch.undo()
    assert made[True][0].graph is not None and made[False][0].graph is None
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
