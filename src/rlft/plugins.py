"""Load user code named as ``'package.module:name'`` or ``'path/to/file.py:name'``: reward
functions, tools, environment classes. Every failure is an error of the caller's kind naming the spec."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlft.errors import RewardError, RlftError

_FORMS = "expected 'package.module:function' or 'path/to/file.py:function'"


def load_custom_reward(spec: str) -> Callable[..., Any]:
    """A user reward function (see :func:`load_object`); failures are :class:`RewardError`."""
    return load_object(spec, "custom reward", RewardError)


def load_object(spec: str, label: str, error: type[RlftError] = RlftError) -> Callable[..., Any]:
    """Import and return the callable named by ``spec``.

    ``'package.module:function'`` is imported with :mod:`importlib`;
    ``'path/to/file.py:function'`` (relative to the working directory) is
    executed as a module with a unique name, with the file's folder on
    ``sys.path`` while it runs so it can import its neighbours; it runs once
    for as long as the file is unchanged.  ``function``
    may be dotted (``Class.method``).  Every failure raises
    ``error`` whose message starts with ``label`` and ``spec``.
    """
    target, sep, attr = spec.rpartition(":")
    where = f"{label} '{spec}'"
    if not sep or not target or not attr:
        raise error(f"{where}: {_FORMS}")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(where, Path(target), error)
    else:
        module = _import_module(where, target, error)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise error(f"{where}: {target} has no attribute '{attr}'{_hint(module)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise error(f"{where}: '{attr}' is a {type(obj).__name__}, not a function or class")
    return obj


def _import_module(where: str, name: str, error: type[RlftError]) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise error(
                f"{where}: module '{name}' not found (is it installed or on PYTHONPATH? a file path must end in .py)"
            ) from None
        raise error(f"{where}: importing '{name}' failed: {exc}") from None
    except Exception as exc:
        raise error(f"{where}: importing '{name}' raised {type(exc).__name__}: {exc}") from None


def _load_file(where: str, path: Path, error: type[RlftError]) -> Any:
    if not path.is_file():
        raise error(f"{where}: file not found: {path}")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    name = f"rlft_user_{_identifier(resolved.stem)}_{digest}"
    stat = resolved.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__rlft_stamp__", None) == stamp:
        # One file, one module: an environment class and the rewards that read its instances (TRL
        # scripts keep them side by side) share their classes, so isinstance() holds between them.
        return loaded
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise error(f"{where}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses, pickling and typing look modules up here
    folder = str(resolved.parent)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise error(f"{where}: running {path} raised {type(exc).__name__}{line}: {exc}") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    module.__rlft_stamp__ = stamp
    return module


def _identifier(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)


def _hint(module: Any) -> str:
    names = sorted(
        n
        for n, v in vars(module).items()
        if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    )
    return f" (functions defined there: {', '.join(names[:10])})" if names else ""


def address_of(obj: Any) -> str | None:
    """The ``'module:name'`` or ``'path/to/file.py:name'`` that :func:`load_object` loads ``obj`` from
    again (in another process), or None for one it cannot reach (a closure, a lambda, an object)."""
    module_name, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    module = sys.modules.get(module_name or "")
    if module is None or not qualname or "<" in qualname:
        return None
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not obj:
        return None
    if module_name.startswith("rlft_user_"):
        return f"{module.__file__}:{qualname}"
    return f"{module_name}:{qualname}"
