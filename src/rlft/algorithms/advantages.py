"""Advantage estimators: rewards (and values) -> per-token advantages.

Each estimator takes an :class:`AdvantageInputs` bundle plus keyword-only
hyper-parameters and returns :class:`Advantages` of shape [N, T] (zero on
tokens outside the loss mask), so sequence-level estimators (GRPO, RLOO) and
token-level ones (REINFORCE++, GAE) share one call.  Loss masks may have holes
(tool output between model turns in multi-turn rollouts): token-level
recursions step over masked positions as if they were not there.

``AdvantageInputs.valid`` marks the rows that count: a row the machinery ended (a tool timeout, a
crashed environment, a reward service down) is left out of every statistic -- a group's mean, std
and leave-one-out baseline, a batch's whitening moments -- and gets advantage 0, so the other rows'
advantages are exactly those of the batch without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlft.algorithms.registry import Registry

# Traits: ``group_relative`` -- the baseline compares the completions of one prompt, so it needs
# num_generations >= 2; ``needs_values`` -- a critic must provide V(s_t) (AdvantageInputs.values);
# ``excludes`` -- which statistics leave out the rows that are not AdvantageInputs.valid: ``group``
# (the mean / std / leave-one-out baseline of their group) or ``batch`` (the whitening moments).
ADVANTAGES: Registry = Registry("advantage estimator")


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may use.

    rewards: [N] one outcome reward per completion; completions of the same prompt are contiguous,
        ``group_size`` of them per prompt.
    mask: [N, T] 1 on completion tokens that count in the loss.
    token_rewards: [N, T] per-token reward terms added to the outcome (e.g. -beta * KL when KL is
        placed in the reward), or None.  Sequence-level estimators use their sum per row.
    values: [N, T] critic values V(s_t) of the state before each token (GAE only), or None.
    reduce: ``reduce(tensor, op)`` combines per-process partial results (op ``sum``, ``min``,
        ``max``) over every process holding part of the batch, for the statistics of the whole
        batch (whitening); None: this process holds all of it.
    valid: [N] bool, False on rows left out of every statistic (advantage 0), or None: all count.
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    group_size: int
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None
    valid: torch.Tensor | None = None

    def live_mask(self) -> torch.Tensor:
        """[N, T] the loss mask with the rows that are not ``valid`` zeroed."""
        if self.valid is None:
            return self.mask
        return self.mask * self.valid.to(self.mask.device, self.mask.dtype).unsqueeze(-1)

    def sequence_rewards(self) -> torch.Tensor:
        """[N] outcome reward plus the sum of the per-token terms."""
        r = self.rewards.float()
        if self.token_rewards is not None:
            r = r + (self.token_rewards.float() * self.mask).sum(-1)
        return r

    def dense_rewards(self) -> torch.Tensor:
        """[N, T] the outcome reward on each row's last loss token, plus the per-token terms."""
        dense = place_on_last_token(self.rewards.float(), self.mask)
        if self.token_rewards is not None:
            dense = dense + self.token_rewards.float() * self.mask
        return dense


@dataclass
class Advantages:
    """advantages: [N, T]; returns: [N, T] regression targets of a critic (GAE only), else None."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


def place_on_last_token(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put each row's scalar reward on its last loss token. rewards: [N], mask: [N, T] -> [N, T].

    A row without loss tokens gets nothing (it has no action to credit)."""
    mask = mask.float()
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values
    dense = torch.zeros_like(mask)
    has_tokens = last >= 0
    dense[has_tokens, last[has_tokens]] = rewards[has_tokens].to(dense.dtype)
    return dense


def _grouped(rewards: torch.Tensor, group_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if group_size <= 0 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.to(dtype).view(-1, group_size)


def group_normalize(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale: bool,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
    tied_weight: float = 0.0,
    reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Centre each group's rewards on the group mean and optionally divide by the group std.

    rewards: [N] with N divisible by group_size -> [N]. The std is the unbiased
    one (as in the GRPO paper's reference code); a group of one gets advantage 0. The statistics
    are taken in float64: in a group of nearly equal fp32 rewards the centring's rounding error,
    divided by the tiny std, would otherwise leave the group's advantages summing far from zero.
    valid: [N] bool or None; the statistics use only a group's valid members, the others get 0.
    tied_weight: a group whose rewards are all equal gets ``tied_weight`` times its reward centred
    (and, with ``scale``, standardised) on the whole batch instead of 0 -- see :func:`_tied_groups`.
    reduce: combines the statistics of a batch spread over processes (:class:`AdvantageInputs`).
    """
    grouped = _grouped(rewards, group_size, torch.float64)
    keep = None if valid is None else _grouped(valid.to(rewards.device), group_size, torch.float64)
    k = torch.ones_like(grouped) if keep is None else keep
    count = k.sum(dim=1, keepdim=True)
    mean = (grouped * k).sum(dim=1, keepdim=True) / count.clamp(min=1.0)
    centred = (grouped - mean) * k
    if scale:
        var = centred.square().sum(dim=1, keepdim=True) / (count - 1).clamp(min=1.0)
        centred = centred / (var.sqrt() + eps)
    flat = flat_groups(grouped, keep)
    centred = centred.masked_fill(flat, 0.0)
    if tied_weight:
        centred = torch.where(flat, tied_weight * _tied_groups(grouped, k, scale, eps, reduce), centred)
    return centred.reshape(-1).float()


def _tied_groups(
    grouped: torch.Tensor,
    keep: torch.Tensor,
    scale: bool,
    eps: float,
    reduce: Callable[[torch.Tensor, str], torch.Tensor] | None,
) -> torch.Tensor:
    """Each reward centred on the mean of the whole batch's kept rewards (and divided by their std
    with ``scale``). grouped, keep: [groups, G] -> [groups, G], 0 where not kept.

    Why: a group whose completions all got one reward teaches a group-relative estimator nothing,
    and once the policy is nearly deterministic most groups tie -- a wrong answer the policy has
    settled on is then never pushed down again. Compared with the batch, a group tied below the
    batch's mean gets a negative advantage (its answer is made less likely, which restores
    exploration), one tied above it a positive one."""
    combine = reduce or (lambda t, op: t)
    total, count = combine(torch.stack([(grouped * keep).sum(), keep.sum()]), "sum").tolist()
    if count < 2:
        return torch.zeros_like(grouped)
    dev = (grouped - total / count) * keep
    if scale:
        var = float(combine(dev.square().sum().reshape(1), "sum")) / (count - 1)
        dev = dev / (var**0.5 + eps)
    return dev


def flat_groups(grouped: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """[groups, 1] True for groups whose (kept) rewards are all equal. Their advantage is set exactly:
    their float mean need not equal the rewards (0.3 * 6 / 6 != 0.3), and dividing that rounding
    residue by a tiny std would blow it up. keep: [groups, G] 1 on the members that count, or None: all."""
    if keep is None:
        return grouped.max(dim=1, keepdim=True).values == grouped.min(dim=1, keepdim=True).values
    inf = torch.tensor(float("inf"), dtype=grouped.dtype, device=grouped.device)
    top = torch.where(keep > 0, grouped, -inf).max(dim=1, keepdim=True).values
    return top <= torch.where(keep > 0, grouped, inf).min(dim=1, keepdim=True).values


def _zero_flat_groups(adv: torch.Tensor, grouped: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``adv`` [groups, G] with exactly 0 for the groups whose rewards are all equal (:func:`flat_groups`)."""
    return adv.masked_fill(flat_groups(grouped, keep), 0.0)


def _broadcast(seq_adv: torch.Tensor, mask: torch.Tensor) -> Advantages:
    return Advantages(seq_adv.unsqueeze(-1) * mask.to(seq_adv.dtype))


@ADVANTAGES.register("grpo", group_relative=True, excludes="group")
def grpo_advantages(
    inputs: AdvantageInputs, *, scale_rewards: bool = True, eps: float = 1e-4, tied_group_weight: float = 0.0
) -> Advantages:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, sec. 4.1.2), broadcast to every token.

    A_i = (R_i - mean(R_group)) / (std(R_group) + eps).

    Departures from the paper: the std gets ``eps`` added (not only guarded
    against zero) so an all-equal group yields exactly 0 rather than NaN;
    ``scale_rewards=False`` drops the std (as Dr. GRPO does); per-token reward
    terms (KL placed in the reward) are summed into R_i.  Rows that are not ``inputs.valid`` are left
    out of their group's mean and std and get 0.
    """
    seq = group_normalize(
        inputs.sequence_rewards(),
        inputs.group_size,
        scale=scale_rewards,
        eps=eps,
        valid=inputs.valid,
        tied_weight=tied_group_weight,
        reduce=inputs.reduce,
    )
    return _broadcast(seq, inputs.live_mask())


@ADVANTAGES.register("dr_grpo", group_relative=True, excludes="group")
def dr_grpo_advantages(inputs: AdvantageInputs, *, tied_group_weight: float = 0.0) -> Advantages:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = R_i - mean(R_group).

    The paper's other half, removing the 1/|o_i| length normalisation, is the loss aggregation
    ``seq_mean_token_sum_norm`` that the ``dr_grpo`` preset selects; no departure here.  Rows that
    are not ``inputs.valid`` are left out of their group's mean and get 0.
    """
    seq = group_normalize(
        inputs.sequence_rewards(),
        inputs.group_size,
        scale=False,
        valid=inputs.valid,
        tied_weight=tied_group_weight,
        reduce=inputs.reduce,
    )
    return _broadcast(seq, inputs.live_mask())


@ADVANTAGES.register("rloo", group_relative=True, excludes="group")
def rloo_advantages(inputs: AdvantageInputs) -> Advantages:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = R_i - mean of the *other* G-1 rewards.

    Equals G / (G - 1) * (R_i - mean(R_group)), so each group sums to zero.  A group of one has no
    other sample to compare with and gets advantage 0 (the papers assume G >= 2).  Rows that are not
    ``inputs.valid`` are no "other sample": G counts a group's valid rows, and they get 0.
    """
    grouped = _grouped(inputs.sequence_rewards(), inputs.group_size)
    if inputs.valid is not None:
        return _broadcast(
            _masked_rloo(grouped, _grouped(inputs.valid.to(grouped.device), inputs.group_size)), inputs.live_mask()
        )
    g = inputs.group_size
    if g == 1:
        return _broadcast(torch.zeros(grouped.numel(), device=grouped.device), inputs.mask)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (g - 1)
    return _broadcast(_zero_flat_groups(grouped - baseline, grouped).reshape(-1), inputs.mask)


def _masked_rloo(grouped: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """RLOO over each group's kept members. grouped, keep: [groups, G] -> [N]; 0 where not kept and in
    groups with fewer than two kept members."""
    count = keep.sum(dim=1, keepdim=True)
    others = ((grouped * keep).sum(dim=1, keepdim=True) - grouped) / (count - 1).clamp(min=1.0)
    adv = torch.where((keep > 0) & (count > 1), grouped - others, torch.zeros_like(grouped))
    return _zero_flat_groups(adv, grouped, keep).reshape(-1)


def discounted_returns(dense_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over loss tokens (masked positions are skipped). [N, T] -> [N, T]."""
    mask = mask.float()
    out = torch.zeros_like(dense_rewards, dtype=torch.float32)
    running = torch.zeros(dense_rewards.shape[0], device=dense_rewards.device)
    for t in reversed(range(dense_rewards.shape[1])):
        m = mask[:, t]
        new = dense_rewards[:, t].float() + gamma * running
        running = torch.where(m > 0, new, running)
        out[:, t] = new * m
    return out


def whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-8,
    reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(x - mean) / std over the masked entries of the whole batch; zero outside the mask. [N, T] -> [N, T].

    The moments are sums in float64, combined by ``reduce`` when the batch is spread over
    processes (see :class:`AdvantageInputs`), so every process whitens with the global statistics."""
    combine = reduce or (lambda t, op: t)
    m, v = mask.double(), values.double()
    inside = v[m > 0]
    bounds = (
        torch.stack([inside.min(), -inside.max()])
        if inside.numel()
        else torch.full((2,), float("inf"), dtype=torch.float64)
    )
    bounds = combine(bounds, "min")
    total, count = combine(torch.stack([(v * m).sum(), m.sum()]), "sum").tolist()
    if count == 0 or float(bounds[0]) == -float(bounds[1]):
        return torch.zeros_like(values)  # nothing to normalise; avoids amplifying rounding residue
    mean = total / count
    var = float(combine(((v - mean).square() * m).sum().reshape(1), "sum")) / count
    return ((v - mean) * (var + eps) ** -0.5 * m).to(values.dtype)


@ADVANTAGES.register("reinforce_pp", excludes="batch")
def reinforce_pp_advantages(inputs: AdvantageInputs, *, gamma: float = 1.0) -> Advantages:
    """REINFORCE++ (Hu et al. 2025): per-token discounted returns, whitened over the whole batch.

    The dense reward is the outcome on the last token plus the per-token terms (the
    ``reinforce_pp`` preset places -beta * KL there).  No critic and no per-prompt baseline: the
    global normalisation is the baseline.  The mean and std are over the whole rollout batch's
    loss tokens, all processes' of a data-parallel run (the paper's "global batch").  Rows that are not
    ``inputs.valid`` are left out of the mean and std and get 0.
    """
    mask = inputs.live_mask()
    returns = discounted_returns(inputs.dense_rewards(), mask, gamma)
    return Advantages(whiten(returns, mask, reduce=inputs.reduce))


@ADVANTAGES.register("gae", needs_values=True, excludes="batch")
def gae_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 0.95, whiten_advantages: bool = True
) -> Advantages:
    """Generalised advantage estimation (Schulman et al. 2016) with a learned value function.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last token is 0);
    A_t = delta_t + gamma * lam * A_{t+1};  returns R_t = A_t + V_t (the critic's targets).

    Departures: the advantages (not the returns) are whitened over the batch's loss tokens, as
    most RLHF PPO implementations do; masked positions inside a sequence are skipped, so the
    "next" value of a model token before a tool response is that of the next model token.  Rows that
    are not ``inputs.valid`` are left out of the whitening and get advantage 0 and return 0.
    """
    if inputs.values is None:
        raise ValueError("gae needs critic values (AdvantageInputs.values)")
    rewards, values, mask = inputs.dense_rewards(), inputs.values.float(), inputs.live_mask().float()
    adv = torch.zeros_like(values)
    last_gae = torch.zeros(values.shape[0], device=values.device)
    next_value = torch.zeros_like(last_gae)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        adv[:, t] = gae_t * m
        last_gae = torch.where(m > 0, gae_t, last_gae)
        next_value = torch.where(m > 0, values[:, t], next_value)
    returns = (adv + values) * mask
    return Advantages(whiten(adv, mask, reduce=inputs.reduce) if whiten_advantages else adv, returns)


def compute_advantages(name: str, inputs: AdvantageInputs, /, **pool) -> Advantages:
    """Run the named estimator; it takes the hyper-parameters it declares from ``pool``."""
    return ADVANTAGES.call(name, inputs, **pool)
