"""Loss aggregation modes and the per-micro-batch policy objective.

The central property: with the counts of the *whole* batch passed to every micro-batch, summing the
micro-batch losses (and gradients, and statistics) gives exactly the full-batch values.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlft.algorithms import AGGREGATIONS, POLICY_LOSSES, aggregate, masked_mean, policy_objective


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# --------------------------------------------------------------------------- aggregation


def test_aggregation_modes_hand_computed():
    v = t([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    kw = dict(num_tokens=3, num_seqs=2, max_len=4)
    assert aggregate(v, m, "token_mean", **kw).item() == pytest.approx(6 / 3)
    assert aggregate(v, m, "seq_mean_token_mean", **kw).item() == pytest.approx((2.0 + 2.0) / 2)
    assert aggregate(v, m, "seq_mean_token_sum_norm", **kw).item() == pytest.approx((4 / 4 + 2 / 4) / 2)
    assert masked_mean(v, m).item() == pytest.approx(2.0)


def test_aggregation_ignores_values_under_the_mask():
    # the 100s sit on masked tokens (a hole and padding); same numbers as the table above
    v = t([[1.0, 100.0, 3.0], [2.0, 100.0, 100.0]])
    m = t([[1, 0, 1], [1, 0, 0]])
    kw = dict(num_tokens=3, num_seqs=2, max_len=4)
    assert aggregate(v, m, "token_mean", **kw).item() == pytest.approx(2.0)
    assert aggregate(v, m, "seq_mean_token_mean", **kw).item() == pytest.approx(2.0)
    assert aggregate(v, m, "seq_mean_token_sum_norm", **kw).item() == pytest.approx(0.75)


def test_aggregation_divides_by_the_global_counts_not_the_local_ones():
    # one micro-batch row [1, 3] of a batch with 8 tokens in 4 sequences, max_len 5
    v, m = t([[1.0, 3.0]]), t([[1, 1]])
    kw = dict(num_tokens=8, num_seqs=4, max_len=5)
    assert aggregate(v, m, "token_mean", **kw).item() == pytest.approx(4 / 8)  # token sum / 8
    assert aggregate(v, m, "seq_mean_token_mean", **kw).item() == pytest.approx(2 / 4)  # row mean 2, / 4 seqs
    assert aggregate(v, m, "seq_mean_token_sum_norm", **kw).item() == pytest.approx(4 / 5 / 4)  # (4/5) / 4


def test_seq_mean_token_mean_weighs_sequences_equally_token_mean_weighs_tokens():
    # row 0: one token of value 4; row 1: three tokens of value 0
    # token_mean: 4 / 4 tokens = 1;  seq_mean_token_mean: (4 + 0) / 2 = 2;  sum_norm(max_len 4): (4/4 + 0) / 2 = 0.5
    v, m = t([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), t([[1, 0, 0], [1, 1, 1]])
    kw = dict(num_tokens=4, num_seqs=2, max_len=4)
    assert aggregate(v, m, "token_mean", **kw).item() == pytest.approx(1.0)
    assert aggregate(v, m, "seq_mean_token_mean", **kw).item() == pytest.approx(2.0)
    assert aggregate(v, m, "seq_mean_token_sum_norm", **kw).item() == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregation_of_empty_mask_is_zero(mode):
    out = aggregate(t([[5.0, 7.0]]), t([[0, 0]]), mode, num_tokens=0, num_seqs=0, max_len=0)
    assert out.item() == 0.0


def test_masked_mean_empty_is_zero_and_per_row():
    v = t([[1.0, 3.0], [5.0, 7.0]])
    assert masked_mean(v, t([[0, 0], [0, 0]])).item() == 0.0
    # row 0: (1 + 3) / 2 = 2; row 1: no tokens -> 0
    torch.testing.assert_close(masked_mean(v, t([[1, 1], [0, 0]]), dim=-1), t([2.0, 0.0]))


def test_unknown_aggregation_lists_valid_names():
    with pytest.raises(KeyError, match="valid: seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"):
        aggregate(t([[1.0]]), t([[1]]), "sum", num_tokens=1, num_seqs=1, max_len=1)


# --------------------------------------------------------------------------- policy_objective: hand numbers

# ratios [[1.5, 1.0], [0.5, (1.0 masked)]], A [[+1, +1], [-1, -1]], ppo_clip 0.2:
#   r 1.5, A +1: min(1.5, 1.2) -> loss -1.2, clipped;   r 1.0, A +1: loss -1.0
#   r 0.5, A -1: min(-0.5, -0.8) -> loss 0.8, clipped;  masked token excluded
STAT_LP = [[math.log(1.5), 0.0], [math.log(0.5), 0.0]]
STAT_ADV = [[1.0, 1.0], [-1.0, -1.0]]
STAT_MASK = [[1, 1], [1, 0]]
COUNTS = dict(num_tokens=3.0, num_seqs=2.0, max_len=4)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token_mean", (-1.2 - 1.0 + 0.8) / 3),  # -1.4 / 3
        ("seq_mean_token_mean", ((-1.2 - 1.0) / 2 + 0.8) / 2),  # (-1.1 + 0.8) / 2 = -0.15
        ("seq_mean_token_sum_norm", ((-2.2) / 4 + 0.8 / 4) / 2),  # (-0.55 + 0.2) / 2 = -0.175
    ],
)
def test_objective_stats_hand_computed(mode, expected):
    out = policy_objective(
        t(STAT_LP).requires_grad_(True),
        torch.zeros(2, 2),
        t(STAT_ADV),
        t(STAT_MASK),
        None,
        loss_name="ppo_clip",
        loss_params={"clip_low": 0.2, "clip_high": 0.2},
        kl_coef=0.1,
        kl_estimator="k3",
        aggregation=mode,
        **COUNTS,
    )
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.stats["loss"] == pytest.approx(expected, rel=1e-6)
    assert out.stats["pg_loss"] == pytest.approx(expected, rel=1e-6)
    assert out.stats["clip_frac"] == pytest.approx(2 / 3)  # 2 clipped of 3 loss tokens
    assert out.stats["ratio/mean"] == pytest.approx(3.0 / 3)  # (1.5 + 1.0 + 0.5) / 3
    assert "kl" not in out.stats  # no reference: no KL term at all


def test_objective_kl_coef_zero_reports_kl_but_does_not_add_it():
    lp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.full((1, 2), -1.0)
    kw = dict(
        loss_name="ppo_clip",
        loss_params={"clip_low": 0.2, "clip_high": 0.2},
        kl_estimator="k3",
        aggregation="token_mean",
        num_tokens=2.0,
        num_seqs=1.0,
        max_len=2,
    )
    adv = torch.zeros(1, 2)
    off = policy_objective(lp, lp.detach(), adv, torch.ones(1, 2), ref, kl_coef=0.0, **kw)
    on = policy_objective(lp, lp.detach(), adv, torch.ones(1, 2), ref, kl_coef=0.5, **kw)
    k3 = math.exp(-1) + 1 - 1  # r = ref - lp = -1: e^-1 - (-1) - 1
    assert off.loss.item() == pytest.approx(0.0)
    assert on.loss.item() == pytest.approx(0.5 * k3)
    assert off.stats["kl"] == pytest.approx(k3)
    assert on.stats["kl"] == pytest.approx(k3)
    assert on.stats["pg_loss"] == pytest.approx(0.0)  # pg_loss excludes the KL term


def test_objective_kl_term_gradient():
    # k3 = e^(ref - lp) - (ref - lp) - 1, d k3 / d lp = 1 - e^(ref - lp) = 1 - e^-1 at lp 0, ref -1
    # token_mean over 2 tokens, coef 0.5, A = 0: grad = 0.5 * (1 - e^-1) / 2 per token
    lp = torch.zeros(1, 2, requires_grad=True)
    out = policy_objective(
        lp,
        lp.detach(),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        torch.full((1, 2), -1.0),
        loss_name="ppo_clip",
        loss_params={},
        kl_coef=0.5,
        kl_estimator="k3",
        aggregation="token_mean",
        num_tokens=2.0,
        num_seqs=1.0,
        max_len=2,
    )
    (grad,) = torch.autograd.grad(out.loss, lp)
    g = 0.5 * (1 - math.exp(-1)) / 2
    torch.testing.assert_close(grad, t([[g, g]]))


def test_objective_takes_loss_hyperparameters_from_a_pool():
    # a pool like the algorithm config's: 'name' and unrelated keys are ignored; clip_high 0.6 reaches the loss
    # r 1.5, A +1 with clip_high 0.6: unclipped -> loss -1.5 (vs -1.2 at 0.2)
    pool = {
        "name": "dapo",
        "clip_low": 0.2,
        "clip_high": 0.6,
        "dual_clip_c": 3.0,
        "learning_rate": 1e-6,
        "gamma": 1.0,
        "scale_rewards": True,
    }
    out = policy_objective(
        t([[math.log(1.5)]]).requires_grad_(True),
        torch.zeros(1, 1),
        t([[1.0]]),
        t([[1]]),
        None,
        loss_name="ppo_clip",
        loss_params=pool,
        kl_coef=0.0,
        kl_estimator="k3",
        aggregation="token_mean",
        num_tokens=1.0,
        num_seqs=1.0,
        max_len=1,
    )
    assert out.loss.item() == pytest.approx(-1.5, rel=1e-6)
    assert out.stats["clip_frac"] == 0.0


# --------------------------------------------------------------------------- micro-batch invariance


def _run_splits(lp, old, adv, mask, ref, kw, bounds, trim):
    total, stats, grads = 0.0, {}, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = mask[a:b]
        T = lp.shape[1]
        if trim:  # each micro-batch cut to its own longest row, as a padding-aware collator would
            cols = m.sum(0).nonzero()
            T = int(cols.max()) + 1 if cols.numel() else 1
        out = policy_objective(
            lp[a:b, :T], old[a:b, :T], adv[a:b, :T], m[:, :T], None if ref is None else ref[a:b, :T], **kw
        )
        grads.append(torch.autograd.grad(out.loss, lp)[0])
        total += out.loss.item()
        for k, v in out.stats.items():
            stats[k] = stats.get(k, 0.0) + v
    return total, sum(grads), stats


def _batch(seed, B, T, holes):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(B, T, generator=g) * 0.3 - 1).requires_grad_(True)
    old = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    ref = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn(B, T, generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    if holes:
        mask = mask * (torch.rand(B, T, generator=g) > 0.25).float()
    return lp, old, adv, mask, ref


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("splits", [[8], [4, 4], [1, 3, 4], [1] * 8])
def test_objective_independent_of_micro_batch_split(mode, splits):
    g = torch.Generator().manual_seed(7)
    B, T = 8, 6
    lp = (torch.randn(B, T, generator=g) * 0.3 - 1).requires_grad_(True)
    old = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    ref = lp.detach() + torch.randn(B, T, generator=g) * 0.2
    adv = torch.randn(B, 1, generator=g).expand(B, T)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    kw = dict(
        loss_name="ppo_clip",
        loss_params={"clip_low": 0.2, "clip_high": 0.28},
        kl_coef=0.1,
        kl_estimator="k3",
        aggregation=mode,
        num_tokens=float(mask.sum()),
        num_seqs=float(B),
        max_len=T,
    )
    full = policy_objective(lp, old, adv, mask, ref, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, lp)
    bounds = [0]
    for n in splits:
        bounds.append(bounds[-1] + n)
    total, grad, stats = _run_splits(lp, old, adv, mask, ref, kw, bounds, trim=False)
    assert total == pytest.approx(full.loss.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad, full_grad, rtol=1e-5, atol=1e-6)
    for k in ("kl", "clip_frac", "pg_loss"):
        assert stats[k] == pytest.approx(full.stats[k], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_micro_batch_split_gives_same_loss_gradient_and_stats(loss_name, mode, data):
    B = data.draw(st.integers(1, 6), label="B")
    T = data.draw(st.integers(1, 5), label="T")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(B - 1, 1)), max_size=B - 1), label="cuts")) if B > 1 else []
    seed = data.draw(st.integers(0, 2**16), label="seed")
    holes, with_ref, trim = (data.draw(st.booleans(), label=x) for x in ("holes", "with_ref", "trim"))
    lp, old, adv, mask, ref = _batch(seed, B, T, holes)
    ref = ref if with_ref else None
    kw = dict(
        loss_name=loss_name,
        loss_params={"clip_low": 0.2, "clip_high": 0.28, "dual_clip_c": 3.0},
        kl_coef=0.1,
        kl_estimator="k3",
        aggregation=mode,
        num_tokens=float(mask.sum()),
        num_seqs=float(B),
        max_len=T,
    )
    full = policy_objective(lp, old, adv, mask, ref, **kw)
    (full_grad,) = torch.autograd.grad(full.loss, lp)
    total, grad, stats = _run_splits(lp, old, adv, mask, ref, kw, [0, *cuts, B], trim)
    assert total == pytest.approx(full.loss.item(), rel=1e-5, abs=1e-5)
    torch.testing.assert_close(grad, full_grad, rtol=1e-5, atol=1e-6)
    assert set(stats) == set(full.stats)
    for k, v in full.stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-5, abs=1e-5), k
