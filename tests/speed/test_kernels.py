"""rlft's native CPU kernels compute what the decode's PyTorch ops compute, and fail safely."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import rlft.speed.kernels as kernels_module
from rlft.speed.kernels import build as kbuild

if kbuild.compiler() is None:
    pytest.skip("no C compiler on this machine: the native kernels cannot be built", allow_module_level=True)


@pytest.fixture(scope="module")
def kernels():
    k = kernels_module.cpu_kernels()
    assert k is not None, kernels_module.unavailable_reason()
    return k


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    # bf16: the two sides may round one value to neighbouring bf16 numbers
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1.6e-2)
    torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_and_silu_match_pytorch(kernels, dtype):
    g = torch.Generator().manual_seed(0)
    x, y, w = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g).to(dtype), torch.randn(96, generator=g)
    out = torch.empty(5, 96, dtype=dtype)
    _close(kernels.rms_norm(x, w, 1e-5, out), F.rms_norm(x, (96,), w, 1e-5).to(dtype), dtype)
    residual = x.clone()
    kernels.add_rms_norm(residual, y, w, 1e-5, out)
    torch.testing.assert_close(residual, x + y.float())  # the fp32 residual, updated in place
    _close(out, F.rms_norm(x + y.float(), (96,), w, 1e-5).to(dtype), dtype)
    gate_up = (torch.randn(5, 2 * 200, generator=g) * 4).to(dtype)  # the SiLU's tails, not only its middle
    act = kernels.silu_mul(gate_up, torch.empty(5, 200, dtype=dtype))
    gate, up = gate_up.chunk(2, dim=-1)
    _close(act, F.silu(gate) * up, dtype)


def _reference_attention(qkv, cos, sin, keys, values, valid, col, heads):
    """The decode attention in float64 from first principles: returns (out [B, H D], key [B, KVH, D],
    value [B, KVH, D]), the key rotated (cos/sin tables as the kernel takes them)."""
    B, kv_heads, A, D = keys.shape
    x = qkv.double().view(B, heads + 2 * kv_heads, D)
    half = D // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)[:, : heads + kv_heads]
    rotated = x[:, : heads + kv_heads] * cos.double() + swapped * sin.double()
    q, k_new, v_new = rotated[:, :heads], rotated[:, heads:], x[:, heads + kv_heads :]
    k, v = keys.double().clone(), values.double().clone()
    k[:, :, col], v[:, :, col] = k_new.to(keys.dtype).double(), v_new
    q = q.to(keys.dtype).double()  # the query is rounded to the compute dtype, as the PyTorch path rounds it
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("bhd,bhad->bha", q, k).masked_fill(~valid[:, None], float("-inf"))
    out = torch.einsum("bha,bhad->bhd", scores.softmax(-1), v).reshape(B, heads * D)
    return out, k_new, v_new


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,columns",
    [
        (9, 3, 64, 200),  # SmolLM2's heads; more keys than one block of the online softmax
        (4, 4, 128, 40),  # no grouping, a 128-wide head
        (4, 2, 8, 30),  # the tiny test model's head: the scalar path
        (6, 2, 40, 70),  # a head size that is not a multiple of the vector width
    ],
)
def test_decode_attention_matches_a_float64_reference(kernels, dtype, heads, kv_heads, head_dim, columns):
    g = torch.Generator().manual_seed(1)
    B, D, A, col = 3, head_dim, columns, columns - 5
    qkv = torch.randn(B, (heads + 2 * kv_heads) * D, generator=g).to(dtype)
    cos, sin = torch.rand(B, heads + kv_heads, D, generator=g), torch.rand(B, heads + kv_heads, D, generator=g) - 0.5
    keys = torch.randn(B, kv_heads, A, D, generator=g).to(dtype)
    values = torch.randn(B, kv_heads, A, D, generator=g).to(dtype)
    valid = torch.zeros(B, A, dtype=torch.bool)
    valid[0, : col + 1] = True
    valid[1, min(70, col) : col + 1] = True  # left padding that covers the first block of keys entirely
    valid[2, col - 3 : col + 1] = True
    want, k_new, v_new = _reference_attention(qkv, cos, sin, keys, values, valid, col, heads)
    before_k, before_v = keys.clone(), values.clone()
    out = kernels.decode_attention(
        qkv, cos, sin, keys, values, valid, col, heads, torch.empty(B, heads * D, dtype=dtype)
    )
    _close(out, want, dtype)
    _close(keys[:, :, col], k_new, dtype)
    assert torch.equal(values[:, :, col], v_new.to(dtype))
    others = torch.arange(A) != col
    assert torch.equal(keys[:, :, others], before_k[:, :, others])  # only column col is written
    assert torch.equal(values[:, :, others], before_v[:, :, others])


def test_bad_tensors_are_refused_with_a_message_not_read(kernels):
    x, w = torch.randn(4, 32), torch.randn(32)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.rms_norm(x.t().contiguous().t(), w, 1e-5, torch.empty(4, 32))
    with pytest.raises(ValueError, match="expected torch.float32"):
        kernels.rms_norm(x.bfloat16(), w, 1e-5, torch.empty(4, 32))
    with pytest.raises(ValueError, match="norm: x"):
        kernels.add_rms_norm(x, torch.randn(4, 16), w, 1e-5, torch.empty(4, 32))
    with pytest.raises(ValueError, match="does not fit"):
        kernels.silu_mul(torch.randn(4, 30), torch.empty(4, 16))
    keys = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError, match="shapes do not agree"):
        kernels.decode_attention(
            torch.zeros(1, 48),
            torch.zeros(1, 2, 16),
            torch.zeros(1, 2, 16),
            keys,
            keys.clone(),
            torch.ones(1, 8, dtype=torch.bool),
            8,
            1,
            torch.empty(1, 16),
        )  # col past the cache


@pytest.mark.parametrize("rows", [1, 5, 16, 37])
@pytest.mark.parametrize("out_features, in_features", [(16, 2), (48, 64), (80, 96), (960, 576)])
def test_the_thin_bf16_matmul_is_a_rounded_float_matmul(kernels, rows, out_features, in_features):
    if not kernels.thin_bf16_matmul:
        pytest.skip("this CPU has AMX or no AVX512-BF16: oneDNN keeps the decode matmuls")
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(out_features, in_features, generator=g).bfloat16()
    x = torch.randn(rows, in_features, generator=g).bfloat16()
    out = kernels.matmul_bf16(x, kernels.pack_bf16(w))
    assert torch.equal(kernels.pack_bf16(w), _reference_pack(w))
    exact = x.double() @ w.double().T
    assert out.dtype == torch.bfloat16 and out.shape == (rows, out_features)
    # fp32 sums in another order than float64's, rounded once: at most a bf16 step apart
    torch.testing.assert_close(out.double(), exact, atol=1e-4, rtol=2**-7)


def _reference_pack(w: torch.Tensor) -> torch.Tensor:
    """The layout gemm.c reads, by PyTorch ops: [N / 16, K / 2, 16, 2]."""
    N, K = w.shape
    return w.to(torch.bfloat16).view(N // 16, 16, K // 2, 2).transpose(1, 2).contiguous()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except that a NaN's payload may differ (PyTorch's own casts disagree on it)."""
    nan = a.isnan()
    return (
        a.shape == b.shape
        and torch.equal(nan, b.isnan())
        and torch.equal(a.masked_fill(nan, 0).view(torch.int16), b.masked_fill(nan, 0).view(torch.int16))
    )


def test_packing_rounds_like_pytorch_and_lays_out_the_rows_of_every_source(kernels):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 96, generator=g) for n in (48, 8, 8))  # sources need not be multiples of 16
    # ties at the bf16 rounding point (both directions), a NaN, infinities, a subnormal
    q[0, :6] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, float("nan"), float("inf"), -float("inf"), 1e-40])
    whole = torch.cat([q, k, v])
    packed = kernels.pack_bf16([q, k, v])
    ref = _reference_pack(whole)
    assert ref.isnan().sum() == 1 and _same_bits(packed, ref)
    # a bf16 source is copied as it is; a refresh writes into the previous buffer
    again = kernels.pack_bf16(whole.bfloat16() * 2, out=packed)
    assert again.data_ptr() == packed.data_ptr()
    assert _same_bits(again, _reference_pack(whole.bfloat16() * 2))
    with pytest.raises(ValueError, match="is not"):
        kernels.pack_bf16(whole, out=torch.empty(2, 48, 16, 2, dtype=torch.bfloat16))


def test_the_thin_matmul_refuses_weights_it_cannot_pack(kernels):
    with pytest.raises(ValueError, match="multiple of 16"):
        kernels.pack_bf16(torch.zeros(20, 8))
    with pytest.raises(ValueError, match="8 columns each"):
        kernels.pack_bf16([torch.zeros(8, 8), torch.zeros(8, 6)])
    if kernels.thin_bf16_matmul:
        with pytest.raises(ValueError, match="packed weight"):
            kernels.matmul_bf16(torch.zeros(2, 6, dtype=torch.bfloat16), kernels.pack_bf16(torch.zeros(16, 8)))
    # with AMX, oneDNN's tile kernels are the faster ones: the thin matmul stands aside
    assert not kernels_module.CpuKernels(kernels._lib, kernels.flags, True, amx=True).thin_bf16_matmul


def test_a_build_is_cached_per_source_and_flags(tmp_path):
    path, flags = kbuild.build(tmp_path)
    stamp = path.stat().st_mtime_ns
    assert kbuild.build(tmp_path) == (path, flags) and path.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_no_compiler_or_no_cache_gives_a_reason_and_the_pytorch_path(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(kbuild.BuildError, match="does not run"):
        kbuild.build(tmp_path / "cache")
    monkeypatch.setattr(kernels_module, "_STATE", {})
    monkeypatch.setenv("RLFT_CACHE_DIR", str(tmp_path / "cache"))
    assert kernels_module.cpu_kernels() is None
    assert "does not run" in kernels_module.unavailable_reason()
    monkeypatch.delenv("CC")
    monkeypatch.setattr(kernels_module, "_STATE", {})
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    assert kernels_module.cpu_kernels() is None and "could not build in" in kernels_module.unavailable_reason()
    monkeypatch.setattr(kernels_module, "_STATE", {})
    monkeypatch.setenv("RLFT_NATIVE_KERNELS", "0")
    assert kernels_module.cpu_kernels() is None and kernels_module.unavailable_reason() == "RLFT_NATIVE_KERNELS=0"


def test_sampling_inverts_the_distribution_exactly(kernels):
    logits = torch.tensor([[0.0, 1.0, -2.0, 3.0, 0.5, -1.0, 2.0, -30.0]])
    suppress = torch.tensor([3])
    for temperature in (1.0, 0.5):
        probs = torch.softmax(logits.double() / temperature, -1)[0]
        kept = probs.clone()
        kept[3] = 0
        kept /= kept.sum()
        # u on a fine grid: each token must be drawn for exactly its share of it
        n = 20000
        u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        tokens, logprobs = kernels.sample(logits.expand(n, -1).contiguous(), temperature, u, suppress)
        counts = torch.bincount(tokens, minlength=8).double()
        assert counts[3] == 0
        assert (counts - n * kept).abs().max() <= 1.5, (counts, n * kept)
        torch.testing.assert_close(logprobs, probs.log()[tokens].float(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_draws_the_tokens_pytorchs_sampler_draws(kernels, temperature):
    """The same draws as the PyTorch sampler but for float rounding at the edge of a token's interval
    of u (another exp and summation order): 2 to 5 draws in 6400 on 3000- and 49k-token vocabularies."""
    from rlft.rollout import SamplingParams
    from rlft.rollout.sampling import sample_next

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 3000, generator=g) * 3
    sampling = SamplingParams(max_new_tokens=1, temperature=temperature)
    suppress = torch.tensor([7, 2999, 7, 0])  # unsorted, repeated: the kernel takes them as a set
    same = 0
    for draw in range(40):
        u = torch.rand(64, generator=g, dtype=torch.float64)
        banned = suppress if draw % 2 else None
        tokens, logprobs = sample_next(logits, sampling, banned, u, kernels=kernels)
        want_tokens, want_logprobs = sample_next(logits, sampling, banned, u)
        same += int((tokens == want_tokens).sum())
        torch.testing.assert_close(
            logprobs[tokens == want_tokens], want_logprobs[tokens == want_tokens], atol=2e-5, rtol=1e-5
        )
        if banned is not None:
            assert not torch.isin(tokens, banned).any()
    assert same >= 0.997 * 40 * 64, same


def test_sampling_keeps_pytorchs_path_for_filters_and_greedy(kernels, monkeypatch):
    from rlft.rollout import SamplingParams
    from rlft.rollout.sampling import sample_next

    monkeypatch.setattr(kernels, "sample", lambda *a, **k: pytest.fail("top-k/top-p/greedy must not use the kernel"))
    logits = torch.randn(4, 50)
    for sampling in (
        SamplingParams(max_new_tokens=1, top_k=5),
        SamplingParams(max_new_tokens=1, top_p=0.9),
        SamplingParams(max_new_tokens=1, greedy=True),
    ):
        tokens, _ = sample_next(logits, sampling, kernels=kernels)
        assert tokens.shape == (4,)
