"""``estimate_memory(cfg)``: a run's predicted peak memory, phase by phase, and whether it fits.

    >>> est = estimate_memory(load_config("configs/minimal_example.yaml"), device="H100-80GB")
    >>> est.peak / 2**30, est.peak_phase, est.fits

The model is read from its config on the meta device (no weights loaded); the data is read only
for the longest prompt, so a config predicted not to fit is refused in seconds, before a weight
is loaded.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field

from rlft.planner.devices import DeviceSpec, GiB, describe_device, dtype_bytes
from rlft.planner.phases import Geometry, Phases
from rlft.planner.shape import ModelShape, model_shape

HEADROOM = 0.95  # a run is said to fit when its peak is under this share of the device's memory


# how the summary line names each recompute mode (rlft.models.checkpointing)
_CHECKPOINTING = {"off": "off", "selective": "selective (the matmuls' outputs kept)", "full": "on"}


@dataclass
class MemoryEstimate:
    """phases: bytes by component for each phase of a step (the runtime counted in each);
    peak / peak_phase: the largest of them; fits: peak <= HEADROOM x the device's memory."""

    device: DeviceSpec
    shape: ModelShape
    geometry: Geometry
    phases: Phases
    runtime: int
    notes: list[str] = field(default_factory=list)
    processes: int = 1  # a data-parallel run's process count: the estimate is one process's
    sharded: bool = False  # fsdp2: the trained state is split over the processes
    # what an 'auto' setting comes to where the plan decides it, by dotted path: the run applies it
    # (rlft.planner.check.check_memory)
    settings: dict[str, object] = field(default_factory=dict)

    @property
    def totals(self) -> dict[str, int]:
        return {name: self.runtime + sum(parts.values()) for name, parts in self.phases.items()}

    @property
    def peak_phase(self) -> str:
        totals = self.totals
        return max(totals, key=totals.get)

    @property
    def peak(self) -> int:
        return max(self.totals.values())

    @property
    def limit(self) -> int:
        return int(HEADROOM * self.device.total)

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit

    def as_dict(self) -> dict:
        return {
            "device": asdict(self.device),
            "model": asdict(self.shape),
            "geometry": asdict(self.geometry),
            "runtime_bytes": self.runtime,
            "phases": self.phases,
            "totals": self.totals,
            "peak_bytes": self.peak,
            "peak_phase": self.peak_phase,
            "limit_bytes": self.limit,
            "fits": self.fits,
            "notes": self.notes,
            "settings": self.settings,
        }

    def lines(self) -> list[str]:
        """The breakdown as text: one line per phase, its components largest first."""
        out = [
            f"model: {self.shape.model_type}, {self.shape.params / 1e6:.1f}M parameters "
            f"({self.shape.trainable / 1e6:.2f}M trained), {self.shape.layers} layers, "
            f"{self.shape.kv_heads} KV heads x {self.shape.head_dim}",
            f"device: {self.device.name}, {gb(self.device.total)} (a run fits under {gb(self.limit)})",
            f"step: {self.geometry.rows} sequences of up to {self.geometry.seq} tokens "
            f"({self.geometry.prompt_tokens} prompt + {self.geometry.new_tokens} new), "
            f"{self.geometry.micro_rows} per forward/backward, "
            f"{'bf16' if self.geometry.compute_bytes == 2 else 'fp32'} compute, gradient checkpointing "
            f"{_CHECKPOINTING[self.geometry.recompute]}",
        ]
        for name, total in self.totals.items():
            parts = sorted(((k, v) for k, v in self.phases[name].items() if v), key=lambda kv: -kv[1])
            detail = ", ".join(f"{k} {gb(v)}" for k, v in parts)
            mark = "  <- peak" if name == self.peak_phase else ""
            out.append(f"  {name:<14} {gb(total):>10}  = runtime {gb(self.runtime)}, {detail}{mark}")
        verdict = "fits" if self.fits else "does NOT fit"
        out.append(f"predicted peak: {gb(self.peak)} in {self.peak_phase}: {verdict} {self.device.name}")
        return out + [f"note: {n}" for n in self.notes]


def gb(n: int | float) -> str:
    """Bytes in GiB, the unit of PyTorch's and nvidia-smi's memory figures (a "141 GB" H200 has 131 GiB)."""
    return f"{n / GiB:.2f} GiB"


def compute_bytes(cfg, device: DeviceSpec) -> int:
    """2 under bf16 autocast, 4 in fp32 (:func:`rlft.planner.devices.dtype_bytes` of ``model.dtype``)."""
    return dtype_bytes(cfg.model.dtype, device.kind)


def estimate_memory(
    cfg,
    device: str | DeviceSpec | None = None,
    *,
    shape: ModelShape | None = None,
    prompt_tokens: int | None = None,
    processes: int = 1,
    sharded: bool = False,
) -> MemoryEstimate:
    """The predicted peak of ``cfg``'s run on ``device`` (None: where it would train).

    ``shape`` and ``prompt_tokens`` skip reading the model config and the data (tests; the
    advice, which re-estimates changed configs of the same model). ``processes`` > 1: the peak of
    one process of a data-parallel run (its share of the batch; with ``sharded``, fsdp2's share of
    the trained state plus the rollout's whole copy of the weights)."""
    if not isinstance(device, DeviceSpec):
        _import_job(cfg.kind)  # so this process's runtime (measured on a CPU) holds what a run's would
    spec = device if isinstance(device, DeviceSpec) else describe_device(device, cfg.model.device)
    notes: list[str] = []
    if shape is None:
        shape = model_shape(cfg.model)
    if prompt_tokens is None:
        prompt_tokens, note = longest_prompt(cfg)
        if note:
            notes.append(note)
    module, _, function = _kind_memory(cfg.kind).partition(":")
    phases_of = getattr(importlib.import_module(module), function)
    geometry, phases = phases_of(one_process(cfg, processes), shape, spec, prompt_tokens, compute_bytes(cfg, spec))
    if processes > 1:
        notes.append(
            f"one process of {processes}: its share of each step's prompts"
            + (f", 1/{processes} of the weights, gradients, AdamW state and reference (fsdp2)" if sharded else "")
        )
        if sharded:
            phases = _sharded(phases, shape, processes)
    est = MemoryEstimate(spec, shape, geometry, phases, spec.runtime, notes, processes, sharded)
    return _without_a_copy_that_does_not_fit(cfg, est)


def _without_a_copy_that_does_not_fit(cfg, est: MemoryEstimate) -> MemoryEstimate:
    """``rollout.decode_copy: auto`` under LoRA keeps the merged decode copy where the run fits with it; where it
    does not, the estimate without it (the adapters decoded unmerged, rlft.speed.lora_decode), which the run then
    applies."""
    rollout = getattr(cfg, "rollout", None)
    auto = rollout is not None and rollout.decode_copy == "auto" and cfg.model.lora is not None
    if est.fits or not auto or est.geometry.compute_bytes != 2:
        return est
    unmerged = cfg.model_copy(deep=True)
    unmerged.rollout.decode_copy = False
    lean = estimate_memory(
        unmerged,
        est.device,
        shape=est.shape,
        prompt_tokens=est.geometry.prompt_tokens,
        processes=est.processes,
        sharded=est.sharded,
    )
    lean.settings["rollout.decode_copy"] = False
    lean.notes.append(
        f"rollout.decode_copy auto: false, the LoRA adapters decoded unmerged over the base as it is (with the "
        f"merged bf16 copy the peak would be {gb(est.peak)})"
    )
    return lean


SHARDED_PARTS = ("weights", "optimizer", "gradients", "reference")


def one_process(cfg, processes: int):
    """The batch one process of a data-parallel run trains on: its share of the step's prompts
    (and of each mini-batch)."""
    alg = getattr(cfg, "algorithm", None)
    if processes <= 1 or alg is None:
        return cfg
    share = cfg.model_copy(deep=True)
    share.algorithm.rollout_batch_size = max(alg.rollout_batch_size // processes, 1)
    if alg.mini_batch_size:
        share.algorithm.mini_batch_size = max(alg.mini_batch_size // processes, 1)
    return share


def _sharded(phases: Phases, shape: ModelShape, processes: int) -> Phases:
    """fsdp2's phases: the sharded parts divided by the process count, plus the whole fp32 copy of
    the weights the rollout decodes from (:func:`rlft.rl.parallel.spread_over_processes`)."""
    return {
        name: {
            **{k: v // processes if k in SHARDED_PARTS else v for k, v in parts.items()},
            "rollout replica": 4 * shape.params,
        }
        for name, parts in phases.items()
    }


def _import_job(kind: str) -> None:
    from rlft.config.schema import JOB_KINDS

    importlib.import_module(JOB_KINDS[kind].job.partition(":")[0])


def _kind_memory(kind: str) -> str:
    from rlft.config.schema import JOB_KINDS

    return JOB_KINDS[kind].memory


def longest_prompt(cfg) -> tuple[int, str | None]:
    """The longest training or eval prompt in tokens as the run formats it (chat template, tools),
    capped at ``data.max_prompt_length``; for kinds without prompts, their ``max_length``."""
    if cfg.kind != "rl":
        return getattr(cfg.data, "max_length", 0), None
    from rlft.data.prompts import load_prompts
    from rlft.envs.spec import environment_spec
    from rlft.errors import DataError
    from rlft.models.loading import load_tokenizer
    from rlft.models.sources import resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(cfg.model.path))
    cap = cfg.data.max_prompt_length
    spec = environment_spec(cfg.environment)
    tools = spec.prompt_tools if spec is not None else None
    try:
        sets = [load_prompts(cfg.data, tokenizer, split, cfg.train.seed, tools) for split in ("train", "eval")]
    except DataError as exc:
        return cap, f"prompt lengths taken as data.max_prompt_length ({cap}): the data could not be read ({exc})"
    measured = [s.longest for s in sets if s is not None and s.examples and s.longest is not None]
    return (max(measured) if measured else cap), None
