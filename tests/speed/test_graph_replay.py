"""What a CUDA graph replays, checked on a CPU: every token of an attention window runs the same operations on
the same memory with the same host values, so that the graph captured at the window's first token computes
every later one.

A graph keeps its capture's addresses and host arguments. A token that read a tensor made anew each step, a
Python number that moves with the token (a position, a cache column) or a branch taken on the host would
replay the captured token's values, silently: the rollout decodes, wrongly. The GPU tests
(``tests/speed/test_graphed_rows.py -k captured``) catch that where a GPU is; here the GPU's fixed batch runs
eagerly (:class:`rlft.speed.graphed_rows.GraphedRows` with ``graphs=False``, packing off as on a GPU), every
operation of each token is recorded with its operands (the memory of those made before the token, the shape,
strides and dtype of all) and its other arguments, and the tokens of a window are compared. No token may read
a device value on the host either (:mod:`tests.host_reads`): a capture refuses that, and the rollout would decode
eagerly, slower, with only a warning."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import rlft.speed.packed_matmul as packed_matmul
from rlft.models.loading import load_tokenizer
from rlft.rollout import SamplingParams
from rlft.speed.compiled import Compiled
from rlft.speed.graphed_rows import GraphedRows
from tests.host_reads import reads_on_host

from .test_fused_decode import _policy
from .test_graphed_rows import _generate
from .test_lora_decode import _lora_policy


class TokenRecorder(TorchDispatchMode):
    """Every ATen operation dispatched inside it, as (name, operands and arguments): a tensor made before
    the token as its storage's address, shape, strides, offset and dtype, one made by the token itself
    without the address (a graph's own pool serves those), anything else as it is. A compiled function
    (:class:`rlft.speed.compiled.Compiled`, which a graph captures as its generated kernels) is recorded as
    one call, with its arguments (:meth:`call`). The storages of the tensors made before are kept alive
    (``keep``), so that a tensor made anew cannot take an old one's address unseen."""

    def __init__(self, keep: list):
        super().__init__()
        self.ops: list[tuple] = []
        self.host_reads: list[str] = []  # operations that would wait for the GPU (tests/host_reads.py)
        self.made: set[int] = set()
        self.keep = keep

    def _signature(self, args, kwargs) -> tuple[tuple, set[int]]:
        leaves = pytree.tree_leaves((args, kwargs or {}))
        operands = {x.untyped_storage().data_ptr() for x in leaves if isinstance(x, torch.Tensor)}
        signature = []
        for x in leaves:
            if not isinstance(x, torch.Tensor):
                signature.append(x)
                continue
            address = x.untyped_storage().data_ptr()
            if address not in self.made:
                self.keep.append(x.untyped_storage())
            signature.append(
                (None if address in self.made else address, tuple(x.shape), x.stride(), x.storage_offset(), x.dtype)
            )
        return tuple(signature), operands

    def _record(self, name: str, signature: tuple, operands: set[int], out) -> None:
        for y in pytree.tree_leaves(out):  # new tensors; an in-place result is its operand's memory
            if isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() not in operands:
                self.made.add(y.untyped_storage().data_ptr())
        self.ops.append((name, signature))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if reads_on_host(func, args, kwargs):
            self.host_reads.append(str(func))
        signature, operands = self._signature(args, kwargs)
        out = func(*args, **(kwargs or {}))
        self._record(str(func), signature, operands, out)
        return out

    def call(self, compiled: Compiled, args, kwargs):
        """``compiled(*args, **kwargs)`` outside the recorder (Dynamo compiles no frame under a dispatch mode)."""
        with _disable_current_modes():
            signature, operands = self._signature(args, kwargs)
            out = CALL(compiled, *args, **kwargs)
            self._record(f"compiled {compiled.fn.__name__}", signature, operands, out)
        return out


CALL = Compiled.__call__


def _recorded_rollout(monkeypatch, model, tok, sampling, tamper=None, **engine):
    """The fixed batch's rollout with each token recorded: ({window: [the operations of each token]}, its
    GraphedRows). ``tamper(rows)``: run after each token, as the host would between replays (the test of this
    test)."""
    tokens, keep, token, active = [], [], GraphedRows._token, []

    def recorded(rows):
        with TokenRecorder(keep) as rec:
            active.append(rec)
            token(rows)
            active.pop()
        if tamper is not None:
            tamper(rows)
        tokens.append((rows.window, rec.ops + [("host reads", tuple(rec.host_reads))]))

    def compiled_call(compiled, *args, **kwargs):
        return active[-1].call(compiled, args, kwargs) if active else CALL(compiled, *args, **kwargs)

    monkeypatch.setattr(GraphedRows, "WINDOW", 8)  # 30 tokens: four windows
    monkeypatch.setattr(GraphedRows, "_token", recorded)
    monkeypatch.setattr(Compiled, "__call__", compiled_call)
    _, _, (rows,) = _generate(model, tok, monkeypatch, True, sampling, **engine)  # undoes the patches when done
    windows: dict[int, list[list[tuple]]] = {}
    for window, ops in tokens:
        windows.setdefault(window, []).append(ops)
    return windows, rows


def _first_difference(windows: dict[int, list[list[tuple]]]) -> str | None:
    """Where a window's later token departs from its first one (what its graph would replay), or None."""
    for window, runs in windows.items():
        for k, ops in enumerate(runs[1:], start=1):
            if len(ops) != len(runs[0]):
                return f"window {window}, token {k}: {len(ops)} operations against {len(runs[0])}"
            for i, (a, b) in enumerate(zip(runs[0], ops)):
                if a != b:
                    moved = [(x, y) for x, y in zip(a[1], b[1]) if x != y]
                    return f"window {window}, token {k}, operation {i} ({a[0]}): {moved}"
    return None


SAMPLINGS = {
    "seeded": SamplingParams(max_new_tokens=30, n=3, temperature=0.9, seed=3),
    "min_new_tokens_top_k_top_p": SamplingParams(
        max_new_tokens=30, n=3, temperature=1.2, top_k=20, top_p=0.9, seed=5, min_new_tokens=12
    ),
    "greedy": SamplingParams(max_new_tokens=30, n=3, greedy=True),
}


def _check(windows: dict[int, list[list[tuple]]], least: int = 50) -> None:
    assert len(windows) >= 3 and all(len(runs) >= 2 for runs in list(windows.values())[:-1]), {
        w: len(r) for w, r in windows.items()
    }
    assert min(len(ops) for runs in windows.values() for ops in runs) > least  # the whole token was recorded
    reads = {op for runs in windows.values() for ops in runs for op in ops[-1][1]}
    assert not reads, f"a token waits for the GPU, which a capture refuses: {sorted(reads)}"
    assert _first_difference(windows) is None, _first_difference(windows)


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_every_token_of_a_window_replays_its_first(wide_head_model_dir, monkeypatch, sampling):
    model, tok = _policy(wide_head_model_dir)
    _check(_recorded_rollout(monkeypatch, model, tok, sampling, autocast_dtype=None)[0])


@pytest.mark.filterwarnings("ignore::UserWarning")  # Inductor's own, on a CPU without a GPU
def test_the_compiled_decodes_tokens_replay_their_first(wide_head_model_dir, monkeypatch):
    """``rollout.compile_decode``: the compiled layers, draw and rows' ends take the same memory and host
    values at every token of a window (each recorded as one call, whose kernels a graph would replay)."""
    model, tok = _policy(wide_head_model_dir)
    windows, _ = _recorded_rollout(
        monkeypatch, model, tok, SAMPLINGS["min_new_tokens_top_k_top_p"], autocast_dtype=None, compile_decode=True
    )
    calls = {name for runs in windows.values() for ops in runs for name, _ in ops if name.startswith("compiled")}
    assert {"compiled layer_in", "compiled layer_out", "compiled ends_at"} <= calls, calls
    _check(windows, least=10)


@pytest.mark.parametrize("decode_copy", [True, False], ids=["merged_copy", "unmerged"])
def test_a_bf16_lora_policys_tokens_replay_as_on_a_gpu(tiny_model_dir, monkeypatch, decode_copy):
    """bf16 with nothing packed, as on a GPU: the merged decode copy, or the base read in place with the
    adapters' factors (refreshed in place before the rollout) beside it."""
    model, tok = _lora_policy(tiny_model_dir, "bf16"), load_tokenizer(tiny_model_dir)
    monkeypatch.setattr(packed_matmul, "can_pack", lambda dtype, device: False)
    windows, rows = _recorded_rollout(
        monkeypatch, model, tok, SAMPLINGS["seeded"], autocast_dtype=torch.bfloat16, decode_copy=decode_copy
    )
    qkv = rows.fused.layers[0].qkv
    assert qkv.pack_dtype is None and (qkv.low_rank is None) == decode_copy  # the GPU's path, LoRA as asked
    _check(windows)


def test_a_token_that_reads_a_tensor_made_anew_is_caught(wide_head_model_dir, monkeypatch):
    """The check itself: a cache column replaced by a new tensor after each token (a graph would go on
    reading the old one) is found at the window's second token."""
    model, tok = _policy(wide_head_model_dir)

    def anew(rows):
        rows.column = rows.column + 0

    windows, _ = _recorded_rollout(monkeypatch, model, tok, SAMPLINGS["seeded"], tamper=anew, autocast_dtype=None)
    found = _first_difference(windows)
    assert found is not None and found.startswith("window 8, token 1"), found


def test_a_token_that_reads_a_value_on_the_host_is_caught(wide_head_model_dir, monkeypatch):
    """The check itself: a row's end decided on the host inside the token (a capture would fail on it)."""
    import rlft.speed.graphed_rows as graphed_rows

    model, tok = _policy(wide_head_model_dir)
    ends = graphed_rows.ends_at

    def ends_on_host(tok_, lp, t, ended, *rest):
        if bool(ended.all()):  # the host reads a device value
            pass
        return ends(tok_, lp, t, ended, *rest)

    monkeypatch.setattr(graphed_rows, "ends_at", ends_on_host)
    windows, _ = _recorded_rollout(monkeypatch, model, tok, SAMPLINGS["seeded"], autocast_dtype=None)
    with pytest.raises(AssertionError, match=r"waits for the GPU.*is_nonzero"):
        _check(windows)
