"""The job service's filesystem boundary: everything a job reads, runs or writes lies in the workspace.

Every reference in a submitted config (each field typed as one in the schema, see
:mod:`rlft.config.references`: data, model, chat template, reward/tool/environment code, output folder,
run name, tracker store, a built-in environment's files) is checked by :meth:`Workspace.check_config`,
whichever route the config came by (a submission, its overrides, a resume). Paths must resolve, after
symlinks, inside the workspace. Rejected outright, before any
resolution, are the forms behind MLflow's path-traversal CVEs: ``..`` components, backslashes,
percent-encoded characters (``%2e%2e%2f``, double-encoded ``%252e``), NUL bytes, and ``~``. An
absolute path is accepted only if it resolves inside the workspace too.

Code a config names is the one thing that runs with the service's rights, so it must be a file
inside the workspace (``rewards.py:score``, or a module found as a file there) or part of rlft
itself; a module installed elsewhere on the machine (``os:system``) is refused. URLs must be http(s);
a tracker store must be an http(s) server or lie inside the workspace.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

from rlft.config.references import references
from rlft.config.schema import RunConfig

_ENCODED = re.compile(r"%[0-9a-fA-F]{2}")


class PathRefused(ValueError):
    """A path that leaves the workspace or uses a refused form; the message names the field."""


class Workspace:
    def __init__(self, root: str | Path):
        self.root = Path(os.path.realpath(Path(root).expanduser()))
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def service_dir(self) -> Path:
        return self.root / ".rlft"

    def jobs_dir(self) -> Path:
        return self.service_dir / "jobs"

    def resolve(self, raw: str, field: str = "path") -> Path:
        """``raw`` (relative to the workspace, or absolute) as a real path inside it, or PathRefused."""
        if not isinstance(raw, str) or not raw:
            raise PathRefused(f"{field}: expected a path, got {raw!r}")
        if "\x00" in raw or "\\" in raw or _ENCODED.search(raw) or raw.startswith("~"):
            raise PathRefused(f"{field}: {raw!r} uses a refused form (backslash, percent-encoding, NUL or ~)")
        path = Path(raw)
        if ".." in path.parts:
            raise PathRefused(f"{field}: {raw!r} contains '..'; paths must stay inside the workspace")
        if len(raw) > 4096 or any(len(part) > 255 for part in path.parts):
            raise PathRefused(f"{field}: the path is longer than a file system allows")
        real = Path(os.path.realpath(path if path.is_absolute() else self.root / path))
        if real != self.root and self.root not in real.parents:
            raise PathRefused(f"{field}: {raw!r} resolves to {real}, outside the workspace {self.root}")
        return real

    def check_code_ref(self, ref: str, field: str) -> None:
        """A 'file.py:name' or 'module:name' reference must name code inside the workspace (or rlft's)."""
        target = ref.rpartition(":")[0] or ref
        if target.endswith(".py") or "/" in target:
            self.resolve(target, field)
            return
        if target == "rlft" or target.startswith("rlft."):
            return
        parts = target.split(".")
        candidates = [Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"]
        for rel in candidates:
            if (self.root / rel).is_file():
                self.resolve(str(rel), field)
                return
        raise PathRefused(
            f"{field}: module {target!r} is not a file inside the workspace; the job service runs "
            f"only code that lives there (write it as 'path/to/file.py:name')"
        )

    def check_command(self, raw: str, field: str) -> None:
        """A program the job starts (an MCP server over stdio): only Python running a script or module
        inside the workspace, the same code a 'file.py:name' reference may name. Any other program
        is refused: the service cannot tell what it reads or writes."""
        words = shlex.split(raw)
        python = bool(words) and re.fullmatch(r"python[0-9.]*", Path(words[0]).name) is not None
        if python and len(words) > 2 and words[1] == "-m":
            self.check_code_ref(words[2], field)
            return
        if python and len(words) > 1 and words[1].endswith(".py"):
            self.resolve(words[1], field)
            return
        raise PathRefused(
            f"{field}: {raw!r}: the job service starts only Python servers that live in the workspace "
            f"([python, path/to/server.py] or [python, -m, module]); give another server as a url"
        )

    def check_url(self, raw: str, field: str) -> None:
        """An endpoint the job calls: http(s) with a host; other schemes (file:, ftp:, ...) are refused."""
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PathRefused(
                f"{field}: {raw!r} is not an http(s) URL with a host; the job service calls only "
                f"http and https endpoints"
            )

    def check_store(self, raw: str, field: str) -> None:
        """A tracker URI: an http(s) server, or a store on disk (a path, ``file:`` or ``sqlite:`` URI) inside
        the workspace. Any other store (a database server, a cloud bucket) is refused: the service cannot
        tell where it writes."""
        scheme = urlsplit(raw).scheme
        if scheme in ("http", "https"):
            self.check_url(raw, field)
        elif scheme == "sqlite" and raw.startswith("sqlite:///"):
            self.resolve(raw[len("sqlite:///") :], field)  # SQLAlchemy: 3 slashes, then the (relative or /) path
        elif scheme == "file":
            self.resolve(urlsplit(raw).path, field)
        elif scheme == "":
            self.resolve(raw, field)
        else:
            raise PathRefused(
                f"{field}: {raw!r}: the job service accepts an http(s) tracking server or a store "
                f"inside the workspace (a path, file: or sqlite:/// URI)"
            )

    def check_run_name(self, raw: str, field: str) -> None:
        """A folder below train.output_dir: relative, with no '..' (the run directory itself is checked
        with :meth:`resolve` once it is joined to the output folder)."""
        if raw.startswith(("/", "~")) or ".." in Path(raw.replace("\\", "/")).parts or "\x00" in raw:
            raise PathRefused(f"{field}: {raw!r} must be a folder name below train.output_dir")

    def check_config(self, cfg: RunConfig) -> list[str]:
        """Every problem with the references of a validated config, one line each: each file, folder,
        model, code reference, URL and tracker store it names (:func:`~rlft.config.references.references`
        finds them from the schema's types) must stay inside the workspace or be refused."""
        checks = {
            "file": self.resolve,
            "dir": self.resolve,
            "model": self.resolve,
            "code": self.check_code_ref,
            "url": self.check_url,
            "command": self.check_command,
            "store": self.check_store,
            "run_name": self.check_run_name,
        }
        problems = []
        for dotted, ref, value in references(cfg):
            try:
                checks[ref.kind](value, dotted)
            except PathRefused as exc:
                problems.append(str(exc))
        return problems
