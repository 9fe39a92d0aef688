"""Run configuration: the pydantic schema (one model per kind of job) and the YAML loader."""

from rlft.config.loader import config_to_yaml, load_config, parse_overrides
from rlft.config.schema import JOB_KINDS, RLConfig, RlftConfig, RunConfig, SFTConfig

__all__ = [
    "JOB_KINDS",
    "RLConfig",
    "RlftConfig",
    "RunConfig",
    "SFTConfig",
    "config_to_yaml",
    "load_config",
    "parse_overrides",
]
