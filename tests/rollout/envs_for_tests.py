"""Environments for the runner tests, in a module of their own: worker processes import it, and it
must stay light (no torch)."""

from __future__ import annotations


class AddEnv:
    """Adds numbers; hangs on request; can crash on reset."""

    def reset(self, **row) -> str | None:
        if row.get("explode"):
            raise ValueError("no such puzzle")
        self.calls = 0
        return None

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        self.calls += 1
        return str(a + b)

    def boom(self, x: str) -> str:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("the tool broke")

    def hang(self, x: str) -> str:
        """Never return.

        Args:
            x: anything
        """
        while True:
            pass

    def get_reward(self) -> float:
        return float(self.calls)


class DyingEnv(AddEnv):
    """AddEnv whose worker process can die mid-episode (a crash, not an exception the tool raises)."""

    def die(self, x: str) -> str:
        """End the worker process.

        Args:
            x: anything
        """
        import os

        os._exit(3)
