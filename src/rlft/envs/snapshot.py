"""What reward functions see of an episode's environment instance (TRL's ``environments=``).

Each episode's environment lives in its own worker process, so the trainer cannot hand a reward the
live object. At the episode's end the worker pickles it instead, and the reward receives that copy,
with the state the tools left on it (``env.reward``, ``env.done``, ``env.active`` ...). An attribute
that cannot be pickled (a client, a socket, a lock) is left off the copy; the rest of the object,
its methods included, is there. An episode whose environment is gone (its worker died or timed out)
gets a :class:`LostEnvironment`, whose every attribute is None, so a TRL-style
``[env.reward for env in environments]`` scores it None ("does not apply") instead of crashing the
step.
"""

from __future__ import annotations

import pickle
from typing import Any


def snapshot(env: Any) -> bytes:
    """``env`` pickled whole if it can be, else a copy of it without the attributes that cannot."""
    try:
        return pickle.dumps(env)
    except Exception:
        pass
    state = getattr(env, "__dict__", None)
    if state is None:  # __slots__ or a C type: nothing to pick from
        raise TypeError(f"{type(env).__name__} cannot be pickled and has no __dict__ to copy")
    copy = object.__new__(type(env))
    for key, value in state.items():
        try:
            pickle.dumps(value)
        except Exception:
            continue
        copy.__dict__[key] = value
    return pickle.dumps(copy)


def restore(blob: bytes | None, why_missing: str) -> Any:
    """The environment copy a worker sent, or a :class:`LostEnvironment` saying why there is none."""
    if blob is None:
        return LostEnvironment(why_missing)
    try:
        return pickle.loads(blob)
    except Exception as exc:
        return LostEnvironment(f"its copy could not be read back ({type(exc).__name__}: {exc})")


class LostEnvironment:
    """Stands in for an environment whose episode ended without one to show (its worker died, timed
    out, or its state could not be copied): every attribute is None, and it is falsy."""

    def __init__(self, why: str):
        self.__dict__["why"] = why

    def __getattr__(self, name: str) -> None:
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<environment lost: {self.why}>"
