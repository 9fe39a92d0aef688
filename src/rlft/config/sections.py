"""The configuration sections every kind of run shares: model, data, train and eval.

Every field has a default and a one-line ``description``.  Unknown keys are rejected so that a
typo never silently falls back to a default.  No torch import: validation stays fast.
"""

from __future__ import annotations

import re
import types
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlft.config.references import FilePath, OutputDir, Reference, RunName, StoreUri

BUILTIN_MODELS = ("smollm2-135m-instruct",)
# A finite number as text, as YAML 1.2 spells one (Section._float_from_text).
_FLOAT_TEXT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
# data.chat_template values that name a template rather than a .jinja file (rlft.chat.templates has them).
CHAT_TEMPLATE_NAMES = ("auto", "tokenizer", "hermes")
# A model folder, a .gguf file or a built-in model's name.
ModelPath = Annotated[str, Reference("model", BUILTIN_MODELS)]


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are re-validated on assignment.

    Types are strict, because a lax reading hides mistakes: ``max_steps: true`` is not 1, ``save_optimizer: 1``
    or ``"yes"`` is not a boolean, an integer field takes no float. A float field takes an integer
    (``learning_rate: 1``) but never ``.inf`` or ``.nan``: those train to non-finite weights and the run
    still ends "completed"."""

    # protected_namespaces: pydantic before 2.10 reserves every "model_" name and warns at import about a field
    # such as critic.model_path; its own methods' names are reserved whatever this says
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False, protected_namespaces=()
    )

    @model_validator(mode="before")
    @classmethod
    def _floats_from_text(cls, data: Any) -> Any:
        """A float field takes a number written as text (``'2e-6'``): yaml.safe_load (YAML 1.1) reads an
        exponent without a dot as a string, and configs parsed by it reach the loader (the job service's)."""
        if not isinstance(data, dict):
            return data
        floats = {f.alias or name for name, f in cls.model_fields.items() if _takes_float(f.annotation)}
        return {
            key: float(value)
            if key in floats and isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip())
            else value
            for key, value in data.items()
        }


def _takes_float(annotation: Any) -> bool:
    """Whether a field's type is ``float`` or a union with it (``float | None``)."""
    return annotation is float or (get_origin(annotation) in (Union, types.UnionType) and float in get_args(annotation))


# --------------------------------------------------------------------------- model


class LoraConfig(Section):
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Module names to adapt, or 'all-linear' for every linear layer but the LM head.",
    )


class ModelConfig(Section):
    path: ModelPath = Field(
        "smollm2-135m-instruct",
        description=f"A Hugging Face model directory, a .gguf file, or a built-in name ({', '.join(BUILTIN_MODELS)}).",
    )
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Compute dtype. bf16 keeps fp32 master weights and runs matmuls under bf16 autocast. "
        "auto: bf16 where it is faster (a GPU with bf16; a CPU whose bf16 matmul, timed once at start, beats "
        "fp32's), else fp32.",
    )
    gradient_checkpointing: bool | Literal["auto", "selective"] = Field(
        "auto",
        description="Recompute activations in the backward to save memory. true: every layer's forward "
        "(about 30 % slower); selective: only the elementwise work (norms, activation functions, casts), keeping "
        "the matmuls' outputs (under half the activation memory, a few per cent slower); false: nothing. auto: "
        "selective on a GPU, off on a CPU, and true where one sequence of the longest length a run can produce "
        "would not fit its activation budget otherwise (RL runs; SFT, DPO and reward-model runs leave it off).",
    )
    compile: bool = Field(
        False,
        description="Compile each decoder layer's training and scoring forward with torch.compile (the work "
        "between its matmuls fused, forward and backward; the backward recomputes what gradient_checkpointing "
        "says). Compiling takes up to a minute at the first steps, cached after; off until measured on a GPU.",
    )
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter instead of all weights.")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")


# --------------------------------------------------------------------------- data


class DataConfig(Section):
    train_file: FilePath = Field(
        ...,
        description="Training rows: .jsonl, .json, .csv or .parquet, or a folder written "
        "by datasets' save_to_disk. Rows in TRL's standard formats load by their column "
        "names (docs/data.md).",
    )
    eval_file: FilePath | None = Field(None, description="Held-out prompts for evaluation (same format).")
    eval_split: float = Field(
        0.0, ge=0, lt=1, description="Fraction of train_file held out for evaluation when eval_file is not set."
    )
    prompt_field: str = Field("prompt", description="Column holding the prompt text.")
    messages_field: str | None = Field(
        None,
        description="Column holding a chat in the Hugging Face format (a list of {role, content}, assistant "
        "tool_calls and tool results included); used instead of prompt_field.",
    )
    system_prompt: str | None = Field(None, description="System message prepended to every prompt.")
    use_chat_template: bool = Field(True, description="Format prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(512, gt=0, description="Prompts longer than this many tokens are left-truncated.")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="What to do with a malformed row: stop with an error, or skip it and count it."
    )
    shuffle: bool = Field(True, description="Shuffle the training rows every epoch (seeded).")
    chat_template: Annotated[str, Reference("file", CHAT_TEMPLATE_NAMES)] = Field(
        "auto",
        description="'auto': the tokenizer's own template, or the built-in Hermes tool template when tools "
        "appear and the tokenizer's cannot render them; 'tokenizer'; 'hermes'; or a path to a .jinja file.",
    )
    tools_field: str = Field(
        "tools",
        description="Column holding a row's tools (JSON schemas) for the chat template; rows without it have none.",
    )


# --------------------------------------------------------------------------- train / eval


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
