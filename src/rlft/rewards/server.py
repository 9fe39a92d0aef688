"""``rlft serve-reward``: any rlft reward (rule, custom, or any mix) behind HTTP, in the wire format
of :mod:`rlft.rewards.remote`, so a reward can run out of process or on another machine and a
training run uses it as ``type: http``.

    rlft serve-reward --reward-config rewards.yaml [--host 127.0.0.1] [--port 8001] [--token T]

``rewards.yaml`` is a ``reward:`` section (or a whole run config; its reward section is used).
``POST /score`` answers ``{"rewards": [weighted total per completion], "per_reward": {name: [...]}}``
(``null`` in ``per_reward`` where a reward returned None: it does not apply to that completion);
a reward that fails is a 422 whose ``detail`` is the RewardError's message (which reward, which
sample). Loopback by default; any other address needs ``--token`` (sent as a bearer token).
"""

# No ``from __future__ import annotations``: FastAPI reads the route signatures at run time, and
# names imported inside create_reward_app would not resolve from strings.
import hmac
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlft.config.explain import validate
from rlft.config.rewards import RewardConfig
from rlft.errors import ConfigError, RewardError


def load_reward_config(path: "str | Path") -> RewardConfig:
    """The reward section of ``path`` (a reward section or a whole config), with dotted-path problems."""
    from rlft.config.yamlio import read_yaml

    raw = read_yaml(Path(path)) or {}
    section = raw.get("reward", raw) if isinstance(raw, dict) else raw
    if not isinstance(section, dict):
        raise ConfigError(["reward: expected a mapping with 'functions'"], str(path))
    cfg, problems, _ = validate(section, RewardConfig)
    if problems:
        raise ConfigError([f"reward.{p}" for p in problems], str(path))
    return cfg


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]] = Field(default_factory=dict)


class ScoreResponse(BaseModel):
    rewards: list[float]
    per_reward: dict[str, list[float | None]]


def create_reward_app(reward: RewardConfig, token: str | None = None):
    from fastapi import Depends, FastAPI, HTTPException, Request

    from rlft.rewards.manager import RewardManager

    manager = RewardManager.from_specs(reward.functions)

    def authorised(request: Request) -> None:
        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(title="rlft reward server", description="Scores completions with the configured rlft rewards.")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "rewards": manager.names}

    @app.post("/score", response_model=ScoreResponse, dependencies=[Depends(authorised)])
    def score(body: ScoreRequest) -> ScoreResponse:
        try:
            result = manager.score(body.prompts, body.completions, body.columns)
        except RewardError as exc:
            raise HTTPException(422, str(exc)) from None
        return ScoreResponse(
            rewards=result.total.tolist(), per_reward={k: _nulls(v.tolist()) for k, v in result.per_reward.items()}
        )

    return app


def _nulls(values: list[float]) -> list[float | None]:
    """NaN (a reward that does not apply to the completion) as JSON null: JSON has no NaN."""
    return [None if v != v else v for v in values]
