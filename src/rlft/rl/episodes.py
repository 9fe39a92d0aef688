"""The ``environment:`` section unpacked: the environment spec, the multi-turn runner around a
rollout engine, the prompts rendered with the environment's tools, and its reward."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache

from rlft.config.schema import DataConfig, RLConfig
from rlft.envs.spec import environment_spec
from rlft.rewards.manager import RewardManager
from rlft.rewards.specs import NamedReward

ENV_REWARD = "environment"
ENVIRONMENTS_PARAM = "environments"  # TRL's name for the episodes' environment instances


def env_tools(cfg: RLConfig) -> list[dict] | Callable[[dict], list[dict]] | None:
    """The tools every prompt offers (see :attr:`rlft.envs.spec.EnvironmentSpec.prompt_tools`); None for
    single-turn runs."""
    spec = environment_spec(cfg.environment)
    return None if spec is None else spec.prompt_tools


def rewards_want_environments(cfg: RLConfig) -> bool:
    """Whether a custom reward takes ``environments`` (TRL's environment instances): only then does
    each episode's environment get copied out of its worker at the end."""
    if cfg.environment is None:
        return False
    return _any_takes_environments(tuple(f.function for f in cfg.reward.functions if f.type == "custom"))


@lru_cache(maxsize=8)
def _any_takes_environments(functions: tuple[str, ...]) -> bool:
    from rlft.plugins import load_custom_reward

    for spec in functions:
        try:
            params = inspect.signature(load_custom_reward(spec)).parameters
        except (TypeError, ValueError):  # no signature to read (a builtin, a C callable)
            continue
        if ENVIRONMENTS_PARAM in params:
            return True
    return False


def environment_line(cfg: RLConfig) -> list[str]:
    """The run log's line naming the environment and the tools the model is offered (MCP servers'
    among them, listed when the run started them), or none for single-turn runs."""
    spec = environment_spec(cfg.environment)
    if spec is None:
        return []
    servers = f"; MCP servers: {', '.join(s.label for s in spec.mcp_servers)}" if spec.mcp_servers else ""
    return [f"environment: {spec.name}; tools: {', '.join(spec.tool_names)}{servers}"]


def _environment_reward(prompts, completions, environment_reward, **_):
    """The environment's own ``get_reward()`` of each episode (the rollout passes it as a column)."""
    return list(environment_reward)


def reward_manager(cfg: RLConfig) -> RewardManager:
    """The configured rewards, plus the environment's get_reward() (named ``environment``) if it has one."""
    from rlft.rewards.specs import named_rewards

    rewards = named_rewards(cfg.reward.functions)
    env = cfg.environment
    spec = environment_spec(env)
    if env is not None and spec is not None and spec.has_reward:
        rewards.append(NamedReward(ENV_REWARD, _environment_reward, env.reward_weight))
    return RewardManager(rewards)


def episode_runner(cfg: RLConfig):
    """A function wrapping a rollout engine into the multi-turn runner, or None for single-turn runs."""
    spec = environment_spec(cfg.environment)
    if spec is None:
        return None
    env, data = cfg.environment, cfg.data

    def wrap(engine):
        from rlft.rollout.episode import EpisodeLimits
        from rlft.rollout.multi_turn import EpisodeRunner

        limits = EpisodeLimits(
            env.max_turns,
            env.max_tool_calls_per_turn,
            env.max_tool_response_tokens,
            env.max_episode_tokens,
            env.tool_timeout,
            env.episode_timeout,
        )
        return EpisodeRunner(
            engine,
            spec,
            limits,
            isolation=env.isolation,
            prompt_for=lambda ex, obs: prompt_with_observation(
                ex, obs, data, engine.tokenizer, spec.for_row(row_of(ex, data)).schemas
            ),
            row_for=lambda ex: row_of(ex, data),
            keep_environments=rewards_want_environments(cfg),
        )

    return wrap


def row_of(example, data: DataConfig) -> dict:
    """The data row ``reset(**row)`` receives: the prompt under its own column name, and the others."""
    return {**example.columns, (data.messages_field or data.prompt_field): example.prompt}


def prompt_with_observation(example, observation: str | None, data: DataConfig, tokenizer, tools) -> str:
    """The example's prompt, with what the environment's reset() returned appended to the last user turn."""
    if observation is None:
        return example.text
    from rlft.data.prompts import format_prompt

    messages = (
        [{"role": "user", "content": example.prompt}]
        if isinstance(example.prompt, str)
        else [dict(m) for m in example.prompt]
    )
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last]["content"] = f"{messages[last]['content']}\n\n{observation}"
    return format_prompt(messages, data, tokenizer, tools)
