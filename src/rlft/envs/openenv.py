"""An environment served by an OpenEnv server (the ``openenv-core`` package), through that package's
own client (pip install 'rlft[openenv]').

An OpenEnv server keeps an episode's state in a WebSocket session (its plain ``POST /reset`` and
``POST /step`` build a fresh environment for every request, so they hold no episode), and its
``GenericEnvClient`` speaks that session with plain dicts. This adapter is an ordinary environment
class (one instance per episode, so one session per episode), and the runner treats it like any
other:

* ``reset(**row)`` opens the session and resets the server's environment with the row's fields,
  the group's ``seed`` and an ``episode_id`` (the server passes on those its ``reset()`` accepts);
  the first observation is appended to the prompt;
* the one tool, ``step(action)``, sends the model's action (a JSON object with the fields of the
  server's action class: ``GET {url}/schema`` lists them) and returns the observation as text;
* the observations' rewards add up to ``get_reward()``, and a ``done`` observation ends the episode;
* a failed request raises, so the model sees it as a tool error, and a server that cannot be
  reached fails ``reset`` with its address in the message.

The server must allow as many concurrent sessions as a step has episodes in flight (OpenEnv's
``max_concurrent_envs``; its environment class sets ``SUPPORTS_CONCURRENT_SESSIONS = True``).
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import uuid
from typing import Any


@contextlib.contextmanager
def _gradio_left_out():
    """Import openenv-core without its web UI. Its ``env_server`` package, which every client module
    imports, loads the Gradio UI a server offers (gradio, a required dependency: 7 s of the package's
    10 s import here) and carries on without it when gradio is missing; a client needs none of it. A
    ``None`` entry in ``sys.modules`` makes ``import gradio`` fail as if it were not installed; it is
    removed afterwards, so gradio imports normally later in this process."""
    if "gradio" in sys.modules:
        yield
        return
    sys.modules["gradio"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("gradio", 0) is None:
            del sys.modules["gradio"]


try:  # at import, not per episode: the fork server the episodes' workers come from preloads this module
    with _gradio_left_out():
        from openenv.core.generic_client import GenericEnvClient
except ImportError:
    GenericEnvClient = None


class OpenEnvClient:
    """kwargs: ``url`` of the server (http:// or ws://), ``timeout`` seconds per message."""

    def __init__(self, url: str, timeout: float = 30.0):
        if GenericEnvClient is None:
            raise ImportError("class: openenv needs the OpenEnv client: pip install 'rlft[openenv]'")
        self.url = url.rstrip("/")
        self._client = GenericEnvClient(base_url=self.url, connect_timeout_s=timeout, message_timeout_s=timeout).sync()
        self.total_reward, self.done = 0.0, False

    def _take(self, result) -> str | None:
        if result.reward is not None:
            self.total_reward += float(result.reward)
        self.done = bool(result.done)
        return observation_text(result.observation)

    def reset(self, **row) -> str | None:
        self.total_reward, self.done = 0.0, False
        try:
            self._client.connect()
        except Exception as exc:
            raise ConnectionError(f"OpenEnv server {self.url}: {exc}") from None
        # the seed comes from Python's random stream, which the runner seeded alike for a whole group
        task = {**row, "seed": random.getrandbits(31), "episode_id": uuid.uuid4().hex}
        return self._take(self._client.reset(**task))

    def step(self, action: dict) -> str:
        """Send an action to the environment and read what it observes next.

        Args:
            action: The action, a JSON object with the fields the environment expects.
        """
        return self._take(self._client.step(action)) or ""

    def get_reward(self) -> float:
        return self.total_reward

    def close(self) -> None:
        self._client.close()


def observation_text(observation: Any) -> str | None:
    """An observation as the model reads it: a string as is; an object with one text field (or a
    ``message``/``text``/``prompt`` field) as that text; anything else as JSON."""
    if observation is None or isinstance(observation, str):
        return observation
    if isinstance(observation, dict):
        for key in ("message", "text", "prompt"):
            if isinstance(observation.get(key), str):
                return observation[key]
        strings = [v for v in observation.values() if isinstance(v, str)]
        if len(strings) == 1:
            return strings[0]
    return json.dumps(observation)
