"""TRL's ``environment_factory`` quick start, as a TRL user writes it, trained by rlft unchanged.

The pattern, from TRL's OpenEnv guide: a class built with no arguments, one instance per episode;
``reset(**row)`` starts an episode; each public method with a typed, documented signature is a tool;
the tools leave their outcome on the instance (``self.reward``); and a reward function reads it back
through ``environments``, one instance per completion. Here the environment echoes what the model
sends and pays for longer messages (as TRL's echo server does), so there is something to learn.

In TRL:   GRPOTrainer(..., environment_factory=EchoEnv, reward_funcs=reward_from_env)
In rlft:  configs/agent_trl_echo.yaml (environment.class: examples/trl/echo_env.py:EchoEnv,
          reward.functions: [{type: custom, function: examples/trl/echo_env.py:reward_from_env}])
"""

from __future__ import annotations

MAX_LENGTH = 40  # characters; a longer message earns no more


class EchoEnv:
    def __init__(self):
        self.reward = 0.0
        self.echoed: list[str] = []

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        self.echoed = []
        return None

    def echo(self, message: str) -> str:
        """Send a message to the environment, which sends it back.

        Args:
            message: The text to echo.

        Returns:
            The same text.
        """
        self.echoed.append(message)
        self.reward = min(len(message), MAX_LENGTH) / MAX_LENGTH
        return message


def reward_from_env(environments, **kwargs) -> list[float]:
    """What each episode's environment says it earned (0 if the model never called the tool)."""
    return [env.reward for env in environments]
