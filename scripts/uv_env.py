"""Print the `export` lines that give uv the package sources pip is configured with here.

uv reads no pip configuration (pip.conf, PIP_* variables), so without these a machine whose packages
come from a mirror, local wheel folders or a constraints file would resolve from elsewhere than pip
does. `pip config list` gives every scope's settings; the highest-precedence one of each wins
(environment, then site, user, global), as in pip.

    eval "$(.venv/bin/python scripts/uv_env.py)"
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys

PRECEDENCE = {"global": 0, "user": 1, "site": 2, ":env:": 3}
# pip's option -> (uv's variable, the separator uv reads between several values)
TO_UV = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
}


def main() -> int:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        scope, _, option = key.rpartition(".")
        rank = PRECEDENCE.get(scope.split(".")[0] if scope != ":env:" else scope, -1)
        if option in TO_UV and rank >= chosen.get(option, (-2, ""))[0]:
            chosen[option] = (rank, ast.literal_eval(raw))
    for option, (_, value) in chosen.items():
        variable, separator = TO_UV[option]
        print(f"export {variable}={shlex.quote(separator.join(value.split()))}")
    # several indexes: take the best version from any of them, as pip does (uv's default stops at the first)
    print("export UV_INDEX_STRATEGY=unsafe-best-match")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
