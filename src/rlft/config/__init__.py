"""Run configuration: the pydantic schema and the YAML loader."""

from rlft.config.loader import config_to_yaml, load_config, parse_overrides
from rlft.config.schema import RlftConfig

__all__ = ["RlftConfig", "config_to_yaml", "load_config", "parse_overrides"]
