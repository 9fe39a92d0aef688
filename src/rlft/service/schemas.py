"""The JSON bodies of the job API (they make its OpenAPI schema at /docs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pending", "running", "success", "failed", "cancelled"]


class TrainRequest(BaseModel):
    """The user document's payload, plus an inline config and --set style overrides."""

    model_config = ConfigDict(extra="forbid")

    config_path: str | None = Field(
        None, max_length=1024, description="A YAML config inside the workspace (relative to it)."
    )
    config: dict[str, Any] | None = Field(None, description="The config itself, instead of config_path.")
    resume_from: str | None = Field(
        None,
        max_length=1024,
        description="null (a new run), 'auto' (this config's latest checkpoint, "
        "else a new run) or a checkpoint directory in the workspace.",
    )
    overrides: list[str] = Field(
        default_factory=list, max_length=64, description="KEY=VALUE overrides, as `rlft train --set`."
    )


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    overrides: list[str] = Field(
        default_factory=list, max_length=64, description="KEY=VALUE changes a resume allows (train.max_steps=20 ...)."
    )


class Submitted(BaseModel):
    job_id: str
    status: Status
    run_dir: str
    stdout_log: str
    stderr_log: str


class JobInfo(BaseModel):
    id: str
    kind: str
    status: Status
    error_type: str | None = None
    exit_code: int | None = None
    pid: int | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    config_source: str | None = None
    run_dir: str
    stdout_log: str
    stderr_log: str
    resume_from: str | None = None
    resumed_job: str | None = None
    cancel_requested: bool = False
    summary: str | None = None
    submitted_by: str | None = None
    step: int | None = Field(None, description="The last step the run logged (from its run.json).")
    total_steps: int | None = None
    last_progress: float | None = Field(
        None, description="When the run last completed a step, or began training (unix time, from its heartbeat)."
    )
    stalled: str | None = Field(
        None,
        description="Set while a running job has completed no step for max(10 min, "
        "5 x its median step time): 'stalled: no step for X min ...'. "
        "The job is not stopped.",
    )
    health: Literal["healthy", "warnings", "unhealthy"] | None = Field(
        None,
        description="The run's health verdict so far (from its run.json; rlft.health): 'unhealthy' is a "
        "run that completes but is not learning as it should. `rlft diagnose RUN_DIR` writes "
        "the report.",
    )
    health_findings: list[dict[str, Any]] = Field(
        default_factory=list, description="The health checks that fired: check, step, severity, message, knob."
    )


class JobDetail(JobInfo):
    config_yaml: str


class JobList(BaseModel):
    jobs: list[JobInfo]


class Logs(BaseModel):
    stream: Literal["stdout", "stderr"]
    text: str


class Metrics(BaseModel):
    records: list[dict[str, Any]]
    offset: int = Field(description="Pass as ?offset= to get only newer records.")
    reset: bool = Field(
        False,
        description="The file was rewritten since that offset (a resume drops the records "
        "after its checkpoint): these records start from the beginning.",
    )


class SampleCompletion(BaseModel):
    completion: str
    reward: float | None = None
    rewards: dict[str, Any] = Field(default_factory=dict)


class SampleGroup(BaseModel):
    step: int
    prompt: str
    completions: list[SampleCompletion]


class Samples(BaseModel):
    groups: list[SampleGroup]


class Evaluations(BaseModel):
    results: list[dict[str, Any]]


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    jobs: dict[str, int]
    auth_required: bool = Field(description="Whether the job routes need a bearer token.")


class Problem(BaseModel):
    """An error: ``detail`` says what is wrong; a refused config lists each problem by dotted path in
    ``problems``. (A body that does not fit the request schema gets FastAPI's list of errors as detail.)"""

    detail: str | list[dict[str, Any]]
    problems: list[str] = Field(default_factory=list)
