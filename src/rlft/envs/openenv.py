"""An environment served over HTTP in the OpenEnv style: ``POST /reset``, ``POST /step``.

The server owns the task; this adapter is an ordinary environment class (one instance per
episode), so the runner treats it like any other: ``reset`` starts a server episode and returns
its first observation (appended to the prompt), the one tool ``step(action)`` posts the model's
action and returns the observation as text, the server's rewards add up to ``get_reward()``,
and a ``done`` observation ends the episode. Request failures raise, so the model sees them as
tool errors and a broken server fails ``reset`` with the server's address in the message.

Wire format: ``POST {url}/reset {"seed": int, "episode_id": str}`` and
``POST {url}/step {"action": {...}, "episode_id": str}``, each answered with
``{"observation": {...} | str, "reward": float | null, "done": bool}``.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any


class OpenEnvHTTP:
    """kwargs: ``url`` of the server, ``timeout`` seconds per request, ``include_row``: also send the
    data row's fields in the reset request (for servers that take the task from the data)."""

    def __init__(self, url: str, timeout: float = 30.0, include_row: bool = False):
        import httpx

        self.url, self.include_row = url.rstrip("/"), include_row
        self._client = httpx.Client(timeout=timeout)
        self.total_reward, self.done = 0.0, False
        self.episode_id = ""

    def _post(self, path: str, body: dict) -> dict:
        response = self._client.post(f"{self.url}{path}", json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{self.url}{path} answered {response.status_code}: {response.text[:200]}")
        data = response.json()
        reward = data.get("reward")
        if reward is not None:
            self.total_reward += float(reward)
        self.done = bool(data.get("done", False))
        return data

    def reset(self, **row) -> str | None:
        self.episode_id, self.total_reward, self.done = uuid.uuid4().hex, 0.0, False
        body: dict[str, Any] = {"seed": random.getrandbits(31), "episode_id": self.episode_id}
        if self.include_row:
            body["row"] = row
        return observation_text(self._post("/reset", body).get("observation"))

    def step(self, action: dict) -> str:
        """Send an action to the environment and read what it observes next.

        Args:
            action: The action, a JSON object with the fields the environment expects.
        """
        return (
            observation_text(self._post("/step", {"action": action, "episode_id": self.episode_id}).get("observation"))
            or ""
        )

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
