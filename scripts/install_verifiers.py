"""Install the `verifiers` extra into this venv beside the `mcp` extra, which pip cannot resolve:
verifiers 0.3 pins mcp<2 and rlft's MCP client needs mcp>=2.3. The part of verifiers rlft drives (the
classic environments and rubrics) never imports mcp -- only verifiers' own MCPEnv does -- so the test
venv takes verifiers with every requirement but that one pin.

    .venv/bin/python scripts/install_verifiers.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {"mcp"}


def pip(*args: str) -> None:
    """pip install, through uv when scripts/setup_env.sh chose it (RLFT_USE_UV=1, its sources exported)."""
    uv = Path(sys.executable).parent / "uv"
    if os.environ.get("RLFT_USE_UV") == "1" and uv.exists():
        command = [str(uv), "pip", "install", "--quiet", "--compile-bytecode", "--python", sys.executable]
        subprocess.run([*command, *args], check=True)
    else:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


def main() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pip("--no-deps", *extras["verifiers"])
    needed = []
    for line in requires("verifiers") or []:
        req = Requirement(line)
        if req.name in SKIPPED or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        needed.append(str(req))
    pip(*needed)
    print(f"install_verifiers: verifiers with {len(needed)} of its requirements (left out: {', '.join(SKIPPED)})")


if __name__ == "__main__":
    main()
