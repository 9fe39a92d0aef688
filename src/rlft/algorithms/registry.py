"""A tiny name -> function registry, one instance per kind of algorithm piece."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Maps names to functions; ``register`` is a decorator, ``get`` lists valid names on a miss.

    A registered function takes its data positionally and its hyper-parameters as keyword-only
    arguments.  :meth:`call` picks those keywords by name from a larger pool (the algorithm's
    plain-scalar settings), so the caller never needs to know which function wants what.

    An entry may declare traits (``register("gae", needs_values=True)``): what the rest of the
    system must provide for it, read with :meth:`trait` instead of testing the name elsewhere.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}
        self._traits: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._items[name] = fn
            self._traits[name] = traits
            return fn

        return deco

    def trait(self, name: str, trait: str, default: Any = False) -> Any:
        """The value of ``trait`` that the named entry declared (``default`` if it declared none)."""
        self.get(name)  # unknown names fail with the valid ones listed
        return self._traits[name].get(trait, default)

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items))
            raise KeyError(f"unknown {self.kind} '{name}'; valid: {valid}") from None

    def hyperparameters(self, name: str) -> list[str]:
        """Names of the keyword-only hyper-parameters the named function declares."""
        sig = inspect.signature(self.get(name))
        return [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def call(self, name: str, /, *data: Any, **pool: Any) -> Any:
        """Call the named function on ``data`` with the hyper-parameters it declares taken from ``pool``."""
        wanted = self.hyperparameters(name)
        return self.get(name)(*data, **{k: v for k, v in pool.items() if k in wanted})

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
