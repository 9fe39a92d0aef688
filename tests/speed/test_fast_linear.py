"""Weight-first linear layers give the same numbers and leave the model as it was."""

from __future__ import annotations

import torch

from rlft.speed.fast_linear import MAX_ROWS, weight_first_linears


def test_same_outputs_hooks_run_and_forward_restored():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 8, bias=False))
    calls = []
    model[1].register_forward_hook(lambda m, i, o: calls.append(o.shape))
    for shape in [(3, 24), (2, 1, 24), (MAX_ROWS + 5, 24)]:
        x = torch.randn(*shape)
        expected = model(x)
        with weight_first_linears(model):
            assert "forward" in model[0].__dict__
            got = model(x)
        assert got.shape == expected.shape and got.is_contiguous()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(calls) == 6  # the hook ran inside and outside the block
    assert "forward" not in model[0].__dict__ and "forward" not in model[1].__dict__


def test_gradients_match():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 12)
    x = torch.randn(4, 16)
    layer(x).square().sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    with weight_first_linears(layer):
        layer(x).square().sum().backward()
    for g, e in zip((p.grad for p in layer.parameters()), expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_only_cpu_models_are_patched():
    model = torch.nn.Linear(4, 4, device="meta")  # stands in for an accelerator: not a CPU tensor
    with weight_first_linears(model):
        assert "forward" not in model.__dict__
