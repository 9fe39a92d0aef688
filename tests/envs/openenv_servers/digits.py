"""An OpenEnv environment written with the openenv-core package and served by its own app (run as
``python digits.py PORT``): find a digit from higher/lower feedback. The digit is the row's
``target`` when reset() is given one, else the seed's last digit; a hit pays 1 and ends the episode."""

from __future__ import annotations

import sys

# Its Gradio web UI stays off (ENABLE_WEB_INTERFACE is unset), and openenv-core leaves it out when gradio
# cannot be imported: that spares each server the UI's 7 s import (rlft's client does the same).
sys.modules["gradio"] = None  # type: ignore[assignment]

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402


class GuessAction(Action):
    guess: int = Field(..., ge=0, le=9, description="A digit from 0 to 9")


class HintObservation(Observation):
    message: str = Field(default="", description="What the environment says")


class DigitEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        super().__init__()
        self.target = 0
        self._state = State(episode_id="", step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, target: int | None = None):
        self.target = target if target is not None else (seed or 0) % 10
        self._state = State(episode_id=episode_id or "", step_count=0)
        return HintObservation(message="guess a digit", reward=None, done=False)

    def step(self, action: GuessAction):  # type: ignore[override]
        self._state.step_count += 1
        if action.guess == self.target:
            return HintObservation(message="yes", reward=1.0, done=True)
        return HintObservation(message="higher" if action.guess < self.target else "lower", reward=0.0, done=False)

    @property
    def state(self) -> State:
        return self._state


app = create_app(DigitEnv, GuessAction, HintObservation, env_name="digits", max_concurrent_envs=64)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
