"""The sections of how a run trains and is checked: train (with its health thresholds and trackers),
distributed and eval. Like every section (:class:`rlft.config.sections.Section`), each field has a default
and a one-line ``description``, and unknown keys are rejected.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from rlft.config.references import OutputDir, RunName, StoreUri
from rlft.config.sections import Section


class HealthConfig(Section):
    """Thresholds of the run-health checks (rlft.health): live warnings during training, the verdict in
    run.json and ``rlft diagnose``. A trend compares the first ``window`` steps with the last ``window``."""

    window: int = Field(
        5,
        gt=0,
        description="Steps averaged at the start and at the end of a trend, and by the quick rate checks "
        "(importance ratio, clip fraction, tool and environment failures).",
    )
    signal_window: int = Field(
        20,
        gt=0,
        description="Steps over which the sustained conditions are measured: signal-less steps, tied "
        "groups, the entropy floor, truncation and the rollout log-prob mismatch (a few bad steps early in a run "
        "that then learns are not a problem).",
    )
    repeat_every: int = Field(20, gt=0, description="Say a problem that persists again every this many steps.")
    no_signal_patience: int = Field(
        5,
        gt=0,
        description="Warn after this many steps in a row with no learning signal (every advantage 0, or "
        "one reward for the whole batch).",
    )
    no_signal_share: float = Field(
        0.75,
        gt=0,
        le=1,
        description="No learning signal in this share of the last signal_window steps makes the run unhealthy.",
    )
    stop_on_no_signal: int | None = Field(
        None,
        gt=0,
        description="Stop the run (checkpoint kept, status completed, verdict unhealthy) after this many "
        "steps in a row with no learning signal; null: never stop.",
    )
    zero_std_share: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Warn when this share of groups, averaged over the last signal_window steps, had "
        "every completion rewarded the same (little to learn from).",
    )
    same_answer_share: float = Field(
        0.75,
        gt=0,
        le=1,
        description="Warn when this share of a step's prompts, averaged over the last signal_window steps, got "
        "one and the same most common completion: the policy answers without reading the prompt.",
    )
    solved: float = Field(
        0.9,
        gt=0,
        le=1,
        description="... unless the task reward (eval.accuracy_reward, a 0-1 reward) averaged at least "
        "this over the same steps: groups tie because their prompts are solved, the healthy end of a run.",
    )
    entropy_collapse: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="Warn when the policy's entropy, over the last signal_window steps, falls below "
        "this fraction of its start ...",
    )
    entropy_floor: float = Field(0.05, ge=0, description="... and below this many nats per token.")
    length_growth: float = Field(0.5, gt=0, description="Warn when mean completion length grows by this fraction.")
    length_collapse: float = Field(
        0.8, gt=0, lt=1, description="Warn when mean completion length shrinks by this fraction of its start ..."
    )
    length_floor: float = Field(3.0, ge=0, description="... to fewer than this many tokens.")
    truncation_rate: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Warn when this share of completions, over the last signal_window steps, hit max_new_tokens.",
    )
    repetition_growth: float = Field(0.15, gt=0, description="Warn when the mean repetition score rises by this much.")
    kl_max: float = Field(
        1.0, gt=0, description="KL to the reference (per token) above this makes the run unhealthy (KL blow-up)."
    )
    ratio_drift: float = Field(
        0.2, gt=0, description="Warn when the mean importance ratio, over the last window, is this far from 1."
    )
    clip_frac_max: float = Field(
        0.3, gt=0, le=1, description="Warn when this share of tokens, over the last window, was clipped."
    )
    grad_spike: float = Field(
        10.0, gt=1, description="Warn when the gradient norm exceeds this multiple of its running median."
    )
    logprob_mismatch: float = Field(
        0.1,
        gt=0,
        description="Warn when the rollout engine's and the trainer's log-probs of the sampled tokens "
        "differ by this much per token on average (rollout/logprob_mismatch, over the last signal_window steps).",
    )
    tool_error_rate: float = Field(
        0.5, gt=0, le=1, description="Warn when this share of tool calls, over the last window, fail."
    )
    env_failure_rate: float = Field(
        0.2,
        gt=0,
        le=1,
        description="Warn when this share of episodes, over the last window, end by a tool timeout "
        "or a crashed environment.",
    )
    dominance: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Warn when one reward other than the task reward carries this share of the reward variation ...",
    )
    patience: int = Field(5, gt=0, description="... for this many steps in a row.")
    accuracy_drop: float = Field(
        0.05, ge=0, description="Held-out accuracy this far below its best (and beyond sampling noise) ..."
    )
    reward_rise: float = Field(0.05, ge=0, description="... while the training reward rose by at least this much ...")
    accuracy_evals: int = Field(
        2, gt=0, description="... in this many evaluations in a row makes the run unhealthy (one noisy eval does not)."
    )
    accuracy_z: float = Field(
        2.0,
        ge=0,
        description="Sampling noise band of an accuracy drop, in standard errors of the difference of "
        "the two accuracies (binomial, over the eval's prompts).",
    )
    rising_steps: int = Field(
        20,
        gt=0,
        description="A run that ends with its held-out accuracy under `solved` and above its best of at least "
        "this many steps earlier by more than the noise band (accuracy_drop, accuracy_z) was still learning: "
        "more steps would likely raise it.",
    )
    fail_on_unhealthy: bool = Field(
        False,
        description="rlft train exits with code 3 when the run ends unhealthy (the run itself completes "
        "and keeps its checkpoint), so scripts and CI can gate on the verdict.",
    )


WatchConfig = HealthConfig  # the section's name before it became the one health check (train.watch)


class TrackingConfig(Section):
    """Where train.report_to's experiment trackers send a run (metrics.jsonl stays the record of truth)."""

    project: str = Field("rlft", description="W&B project and MLflow experiment the run is filed under.")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline",
        description="W&B: offline writes <run_dir>/wandb/ only (upload later with `wandb sync`); online "
        "streams to the W&B server (needs a login).",
    )
    mlflow_tracking_uri: StoreUri | None = Field(
        None, description="MLflow tracking server or store URI (default: sqlite:///<run_dir>/mlflow.db, no server)."
    )


class TrainConfig(Section):
    epochs: int = Field(1, gt=0, description="Passes over the training prompts.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many steps even if epochs remain.")
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    output_dir: OutputDir = Field("./outputs", description="Runs are written to <output_dir>/<run_name>/.")
    run_name: RunName | None = Field(
        None,
        description="Run directory name under output_dir (default: <date>-<time>-<algorithm>); a relative "
        "path that stays below output_dir.",
    )
    logging_interval: int = Field(10, gt=0, description="Write metrics/log lines every N steps.")
    save_interval: int = Field(200, gt=0, description="Save a checkpoint every N steps (and always at the end).")
    health: HealthConfig = Field(
        default_factory=HealthConfig,
        description="Run-health checks: thresholds of the live warnings and of "
        "rlft diagnose, and what an unhealthy run does (train.watch is accepted as its old name).",
    )
    keep_last: int | None = Field(
        None, gt=0, description="Keep only the newest N complete checkpoints (older ones are deleted after a save)."
    )
    save_optimizer: bool = Field(
        True,
        description="Save the optimizer state (two thirds of a full fine-tune's checkpoint) so a run can "
        "resume exactly; false writes export-only checkpoints, which --resume refuses.",
    )
    save_best: bool = Field(
        False,
        description="Keep the model of the best held-out evaluation so far in checkpoints/best/ (weights only, "
        "replaced when a later evaluation's accuracy beats it): a run that ends below its best still has it.",
    )
    ignore_memory_check: bool = Field(
        False, description="Start even when rlft estimate predicts the run will not fit the device's memory."
    )
    samples_per_log: int = Field(
        4, ge=0, description="Prompt/completion pairs written to samples.jsonl per logging step."
    )
    progress_bar: Literal["auto", "on", "off"] = Field(
        "auto", description="Progress bar: on a terminal only (auto), always, never."
    )
    num_threads: int | None = Field(
        None,
        gt=0,
        description="CPU compute threads (default: OMP_NUM_THREADS if set, else one per physical core "
        "this process may use; hyperthreads and cores outside its CPU quota only slow the matmuls down).",
    )
    native_kernels: bool = Field(
        True,
        description="On a CPU, run the hot spots between the matmuls in rlft's C kernels: the decode step's "
        "norms, SiLU, rotary embedding, KV-cache write and attention, sampling, and the LM head's softmax and its "
        "gradient in the update. Compiled once per machine with the system C compiler ($CC, cc, gcc or clang) and "
        "cached; where none compiles, the same work runs as PyTorch ops, with one log line saying why. False (or "
        "RLFT_NATIVE_KERNELS=0): always the PyTorch ops.",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Experiment trackers that also receive the metrics and the config: "
        "tensorboard, wandb, mlflow (a tracker that fails is disabled with a warning; training goes on).",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Experiment tracker settings.")

    @model_validator(mode="before")
    @classmethod
    def _watch_is_health(cls, data: Any) -> Any:
        """``train.watch`` (the reward-hacking watch's thresholds) is read as ``train.health``."""
        if isinstance(data, dict) and "watch" in data:
            if "health" in data:
                raise ValueError("give train.health only (train.watch is its old name)")
            data = {("health" if k == "watch" else k): v for k, v in data.items()}
        return data

    @field_validator("run_name")
    @classmethod
    def _run_name_stays_below_output_dir(cls, value: str | None) -> str | None:
        # A run's folder is output_dir/run_name: an absolute name or a '..' would put it (and resume
        # from) anywhere on the machine, which train.output_dir is there to say.
        parts = PurePosixPath(value.replace("\\", "/")).parts if value is not None else ()
        if value is not None and (not value.strip() or value.startswith(("/", "~")) or ".." in parts):
            raise ValueError("must be a relative folder name below train.output_dir (no leading '/' or '~', no '..')")
        return value


class DistributedConfig(Section):
    """How a run launched by ``torchrun`` (WORLD_SIZE > 1) splits its work; one process ignores it."""

    strategy: Literal["auto", "ddp", "fsdp2"] = Field(
        "auto",
        description="ddp: every process holds the whole model and gradients are summed once per optimizer "
        "step; fsdp2: parameters, gradients and optimizer state sharded per decoder layer (torch fully_shard), "
        "for models whose training state does not fit one device. auto: ddp.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend: auto takes nccl on CUDA, gloo on CPU."
    )
    timeout_minutes: float = Field(
        30.0,
        gt=0,
        description="How long a process waits for the others at a collective before the run fails "
        "(a rank that crashed, a node that went away).",
    )


class EvalConfig(Section):
    before_training: bool = Field(True, description="Evaluate the model before the first step.")
    after_training: bool = Field(True, description="Evaluate the model after the last step.")
    interval: int = Field(0, ge=0, description="Also evaluate every N steps (0 = never during training).")
    max_samples: int | None = Field(None, gt=0, description="Evaluate on at most this many eval prompts.")
    max_new_tokens: int | None = Field(
        None, gt=0, description="Generation budget (default: algorithm.max_new_tokens in RL runs, 256 in SFT runs)."
    )
    batch_size: int = Field(32, gt=0, description="Prompts per generation batch.")
    accuracy_reward: str | None = Field(
        None, description="Name of the reward that defines accuracy (default: the first reward)."
    )
    success_threshold: float = Field(1.0, description="A sample counts as correct when that reward is >= this value.")
    num_samples: int = Field(
        0,
        ge=0,
        description="Also sample this many completions per prompt for sampled accuracy and pass@k "
        "(0 = greedy only; sampled batches hold at most batch_size sequences).",
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of those num_samples completions.")
    pass_k: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [1], description="Report pass@k for each k (each 1 <= k <= num_samples)."
    )
