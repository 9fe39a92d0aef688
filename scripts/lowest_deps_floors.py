"""Print ``name==version`` for each of rlft's core requirements as installed: the constraints that hold
them at the floors scripts/lowest_deps_check.sh installed while the test tools go in beside them."""

from __future__ import annotations

import importlib.metadata as metadata
import re

for requirement in metadata.requires("rlft") or []:
    if "extra ==" not in requirement:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        print(f"{name}=={metadata.version(name)}")
