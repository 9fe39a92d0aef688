"""Arguments that several commands share."""

from __future__ import annotations

import argparse


def add_overrides(p: argparse.ArgumentParser, help: str = "Override a config value (repeatable).") -> None:
    """``--set KEY=VALUE``, repeatable, into ``args.overrides``: a dotted config path and a YAML value that
    replace the file's (:func:`rlft.config.loader.load_config`)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)
