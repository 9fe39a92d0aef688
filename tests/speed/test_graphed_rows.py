"""The GPU decode's rows (a CUDA graph per rollout): the static step it captures, checked on the CPU
against the decode whose finished rows leave the batch; the capture itself where a CUDA GPU is."""

from __future__ import annotations

import time

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

from .test_fused_decode import PROMPTS, _forward_logprobs, _policy


def _graphed_everywhere(monkeypatch, graphs: bool) -> list[GraphedRows]:
    """Make the engine take GraphedRows on any device (captured only if ``graphs``); returns the rows it made."""
    made = []

    def rows(*args, **kwargs):
        made.append(GraphedRows(*args, graphs=graphs, **kwargs))
        return made[-1]

    monkeypatch.setattr(native_engine, "graphs_apply", lambda device: True)
    monkeypatch.setattr(native_engine, "GraphedRows", rows)
    return made


def _scripted_draw(eos: int, stop_at: dict[int, int]):
    """``draw_tokens``, except that row r (its number in the rollout) ends at token ``stop_at[r]``: with
    device operations only, as a CUDA graph replays them, in the loop that drops rows and in the one that keeps them."""
    real, schedules = native_engine.draw_tokens, {}

    def draw(logits, rows, t, sampling, eos_ids, *rest):
        tok, _ = real(logits, rows, t, sampling, eos_ids, *rest)
        if logits.device not in schedules:  # made at the first token, which is drawn before any capture
            schedule = torch.full((1024,), -1, dtype=torch.long)
            schedule[list(stop_at)] = torch.tensor(list(stop_at.values()))
            schedules[logits.device] = schedule.to(logits.device)
        tok = torch.where(schedules[logits.device].index_select(0, rows) == t, eos, tok)
        lp = torch.log_softmax(logits.float() / sampling.temperature, -1).gather(-1, tok[:, None]).squeeze(-1)
        return tok, lp

    return draw


def _generate(model, tok, monkeypatch, graphed: bool, sampling: SamplingParams, stop_at=None, **engine):
    """(the rollout, the work counters, the GraphedRows made) with the fixed batch (``graphed``, not
    captured off a GPU) or the rows that leave the batch."""
    made = _graphed_everywhere(monkeypatch, graphs=engine.pop("graphs", False)) if graphed else []
    CLOCK.reset()
    engine = NativeEngine(
        model, tok, max_prompt_length=64, **{"autocast_dtype": None, "native_kernels": False, **engine}
    )
    if stop_at:
        monkeypatch.setattr(native_engine, "draw_tokens", _scripted_draw(engine.eos_ids[0], stop_at))
    out = engine.generate(PROMPTS, sampling)
    counts = dict(CLOCK.counts)
    monkeypatch.undo()
    return out, counts, made


def test_the_static_step_decodes_what_the_dropping_rows_decode(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    out, counts = {}, {}
    sampling = SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3)
    for graphed in (False, True):
        monkeypatch.setattr(GraphedRows, "WINDOW", 8)  # attention's window grows several times in 40 tokens
        # rows end at different steps: dropped from the batch on one side, kept (padding) on the other
        out[graphed], counts[graphed], made = _generate(model, tok, monkeypatch, graphed, sampling, {0: 1, 4: 3, 5: 20})
    assert len(made) == 1
    rows = made[0]
    assert rows.kv.allocated == rows.kv.capacity == 40  # the whole cache at once: the graph holds its address
    assert rows.prompt.k.shape[1] == len(PROMPTS)  # a prompt's keys and values once for its group of 3
    # the window follows the filled columns up, a multiple of 8 at a time, never past them by 8
    assert rows.windows == [8, 16, 24, 32, 40][: len(rows.windows)] and len(rows.windows) >= 3, rows.windows
    assert rows.kv.length <= rows.windows[-1] < rows.kv.length + 8
    for graphed in (False, True):  # what a step read: at least what its live rows attend to
        assert 0 < counts[graphed]["decode_kv_needed_bytes"] <= counts[graphed]["decode_kv_bytes"]
    # the same tokens were needed on both sides; the prompts read once a group instead of once a row
    assert counts[True]["decode_tokens"] == counts[False]["decode_tokens"]
    assert counts[True]["decode_kv_needed_bytes"] < counts[False]["decode_kv_needed_bytes"]
    lengths = out[True].completion_mask.sum(-1).tolist()
    assert lengths[0] == 2 and lengths[4] == 4 and len(set(lengths)) >= 4 and max(lengths) > 16, lengths
    assert out[True].finish_reasons == out[False].finish_reasons
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        out[True].logprobs[m], _forward_logprobs(model, out[True], False, 0.9)[m], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=24, n=3, temperature=1.3, seed=5, min_new_tokens=6),
        SamplingParams(max_new_tokens=24, n=3, temperature=0.8, top_k=20, top_p=0.9, seed=7),
        SamplingParams(max_new_tokens=24, n=3, greedy=True),
    ],
    ids=["min_new_tokens", "top_k_top_p", "greedy"],
)
def test_the_draw_inside_the_step_samples_what_the_eager_draw_samples(wide_head_model_dir, monkeypatch, sampling):
    """The fixed batch draws every row's token with the token's position held on the device (as a
    graph replays it); seeded rows draw the same tokens as where finished rows leave the batch."""
    model, tok = _policy(wide_head_model_dir)
    eos = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None).eos_ids[0]
    with torch.no_grad():  # end of sequence made likely: rows end at their own steps (none before min_new_tokens)
        hidden = model.model(input_ids=torch.randint(6, 100, (4, 32))).last_hidden_state.reshape(-1, 256)
        model.lm_head.weight[eos] += 0.7 * hidden.mean(0) / hidden.mean(0).norm()
    out = {g: _generate(model, tok, monkeypatch, g, sampling)[0] for g in (False, True)}
    lengths = out[True].completion_mask.sum(-1)
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert torch.equal(lengths, out[False].completion_mask.sum(-1))
    assert out[True].finish_reasons == out[False].finish_reasons
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)
    if not sampling.greedy:  # rows ended at several different tokens
        assert out[True].finish_reasons.count("stop") >= 2 and len(set(lengths.tolist())) >= 3, lengths
    assert int(lengths.min()) > sampling.min_new_tokens


def test_the_fixed_batch_stops_soon_after_its_last_row_ends(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    sampling = SamplingParams(max_new_tokens=60, n=3, temperature=0.9, seed=3)
    out, counts, made = _generate(model, tok, monkeypatch, True, sampling, {r: r % 5 for r in range(9)})
    lengths = out.completion_mask.sum(-1).tolist()
    assert all(0 < length <= r % 5 + 1 for r, length in enumerate(lengths)) and max(lengths) == 5, lengths
    assert out.finish_reasons == ["stop"] * 9
    # the host looks every CHECK_EVERY tokens: the rows ended by token 4, the loop after token 16
    assert made[0].kv.length == GraphedRows.CHECK_EVERY and counts["decode_steps"] == GraphedRows.CHECK_EVERY
    assert counts["decode_tokens"] == sum(length - 1 for length in lengths)  # the steps the rows needed


def test_what_the_graphs_cost_is_counted_apart_from_the_decode(wide_head_model_dir, monkeypatch):
    model, tok = _policy(wide_head_model_dir)
    monkeypatch.setattr(GraphedRows, "WINDOW", 16)

    class Graph:  # stands for a captured token: a replay runs it
        def __init__(self, rows):
            self.replay = rows._token

    def capture(self, warmup):  # a capture's host time, then the token its first replay decodes
        time.sleep(0.05)
        self.graph = Graph(self)
        self.graph.replay()

    monkeypatch.setattr(GraphedRows, "_capture", capture)
    sampling = SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3, min_new_tokens=40)
    out, counts, made = _generate(model, tok, monkeypatch, True, sampling, graphs=True)
    assert made[0].windows == [16, 32, 40]  # a graph a window; the last one reaches the cache's capacity
    assert counts["decode_captures"] == 3 and counts["decode_steps"] == 39
    assert 0.15 <= counts["decode_capture_seconds"] < 0.15 + 2.0


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


def test_cuda_graphs_and_compile_decode_are_native_engine_options():
    assert RolloutConfig().engine_options() == {"cuda_graphs": True, "compile_decode": False}
    options = RolloutConfig(cuda_graphs=False, compile_decode=True).engine_options()
    assert options == {"cuda_graphs": False, "compile_decode": True}
    assert RolloutConfig(engine="hf").engine_options() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("stop_at", [{0: 1, 4: 3, 5: 20}, None], ids=["scripted_ends", "sampled"])
def test_the_captured_graph_decodes_what_the_eager_static_step_decodes(
    wide_head_model_dir, monkeypatch, dtype, stop_at
):
    cuda = torch.device("cuda")
    model = load_policy(
        ModelConfig(path=str(wide_head_model_dir), dtype=dtype, device="cuda"), cuda, model_dir=wide_head_model_dir
    )
    tok = load_tokenizer(wide_head_model_dir)
    autocast = torch.bfloat16 if dtype == "bf16" else None
    sampling = SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3, min_new_tokens=2)
    out, counts, made = {}, {}, {}
    for graphs in (False, True):
        out[graphs], counts[graphs], made[graphs] = _generate(
            model, tok, monkeypatch, True, sampling, stop_at, graphs=graphs, autocast_dtype=autocast, decode_copy=True
        )
    assert made[True][0].graph is not None and made[False][0].graph is None
    assert counts[True]["decode_captures"] == len(made[True][0].windows) and counts[True]["decode_capture_seconds"] > 0
    assert "decode_captures" not in counts[False]
    assert torch.equal(out[True].completion_ids, out[False].completion_ids)
    assert out[True].finish_reasons == out[False].finish_reasons
    m = out[True].completion_mask.bool()
    torch.testing.assert_close(out[True].logprobs[m], out[False].logprobs[m], atol=1e-5, rtol=1e-5)


def _cuda_forward_logprobs(model, r, autocast: bool, temperature: float = 1.0) -> torch.Tensor:
    """The model's own forward's log-probs of the rollout's completions, on the GPU (an independent
    reference: not the decode's code)."""
    from rlft.models.logprobs import completion_logprobs

    cuda = torch.device("cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        lp, _ = completion_logprobs(
            model, r.input_ids.to(cuda), r.attention_mask.to(cuda), r.completion_ids.shape[1], temperature=temperature
        )
    return lp.float().cpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=40, n=3, temperature=0.8, top_k=20, top_p=0.9, seed=7),
        SamplingParams(max_new_tokens=40, n=3, greedy=True),
        SamplingParams(max_new_tokens=40, n=3, temperature=1.0),  # unseeded: torch.rand inside the graph
    ],
    ids=["top_k_top_p", "greedy", "unseeded"],
)
def test_the_captured_graph_across_windows_gives_the_models_own_log_probs(wide_head_model_dir, monkeypatch, sampling):
    """Captured again as the attention's window grows (16 columns: three windows in 40 tokens), with the
    samplers a graph holds, against the model's forward rather than the decode's own eager step."""
    cuda = torch.device("cuda")
    model = load_policy(
        ModelConfig(path=str(wide_head_model_dir), dtype="fp32", device="cuda"), cuda, model_dir=wide_head_model_dir
    )
    tok = load_tokenizer(wide_head_model_dir)
    monkeypatch.setattr(GraphedRows, "WINDOW", 16)
    out, _, made = _generate(model, tok, monkeypatch, True, sampling, graphs=True)
    assert made[0].graph is not None and len(made[0].windows) >= 3, made[0].windows
    m = out.completion_mask.bool()
    ref = _cuda_forward_logprobs(model, out, False, 1.0 if sampling.greedy else sampling.temperature)
    torch.testing.assert_close(out.logprobs[m].cpu(), ref[m], atol=1e-4, rtol=1e-4)
    if not sampling.greedy:  # drawn, not a constant: rows differ
        assert len({tuple(row) for row in out.completion_ids.tolist()}) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_one_engines_captured_graphs_follow_the_weights_over_rollouts_with_the_copy_released_between(
    wide_head_model_dir, monkeypatch
):
    """As training runs it: bf16 decode copy, released for each update and made again, the optimizer
    changing the weights in between; every rollout's log-probs are the autocast forward's (bf16 rounding)."""
    cuda = torch.device("cuda")
    model = load_policy(
        ModelConfig(path=str(wide_head_model_dir), dtype="bf16", device="cuda"), cuda, model_dir=wide_head_model_dir
    )
    tok = load_tokenizer(wide_head_model_dir)
    monkeypatch.setattr(GraphedRows, "WINDOW", 16)
    made = _graphed_everywhere(monkeypatch, graphs=True)
    engine = NativeEngine(
        model, tok, max_prompt_length=64, autocast_dtype=torch.bfloat16, decode_copy=True, native_kernels=False
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for rollout in range(3):
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, n=3, temperature=0.9, seed=3))
        assert len(made) == rollout + 1 and made[-1].graph is not None
        m = r.completion_mask.bool()
        diff = (r.logprobs.cpu() - _cuda_forward_logprobs(model, r, True, 0.9))[m].abs()
        assert diff.max() < 2e-2 and diff.mean() < 3e-3, (rollout, diff.max(), diff.mean())
        engine.release_memory()  # what the trainer does before its update
        model(input_ids=r.input_ids.to(cuda)).logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_biased_models_captured_graph_gives_its_own_log_probs(tiny_model_dir, tmp_path, monkeypatch):
    """Qwen2's q/k/v biases inside the captured step, against the model's forward, before and after the
    biases change in place (an optimizer step)."""
    from .test_fused_decode import _qwen2_dir

    cuda = torch.device("cuda")
    path = _qwen2_dir(tiny_model_dir, tmp_path)
    model = load_policy(ModelConfig(path=str(path), dtype="fp32", device="cuda"), cuda, model_dir=path)
    tok = load_tokenizer(path)
    made = _graphed_everywhere(monkeypatch, graphs=True)
    engine = NativeEngine(model, tok, max_prompt_length=64, autocast_dtype=None, native_kernels=False)
    for _ in range(2):
        r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, n=2, temperature=0.9, seed=5))
        assert made[-1].graph is not None
        m = r.completion_mask.bool()
        ref = _cuda_forward_logprobs(model, r, False, 0.9)
        torch.testing.assert_close(r.logprobs[m].cpu(), ref[m], atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.k_proj.bias.add_(0.7)
