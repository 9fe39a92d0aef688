"""Two environment classes in one run, each data row routed to one by its ``env`` column.

TRL routes rows inside a single class (``reset`` reads the column and picks a game); rlft lets each
game stay its own class and does the routing itself::

    environment:
      classes: {countdown: examples/trl/two_games.py:Countdown, spell: examples/trl/two_games.py:Spell}
      route_column: env

A row of ``countdown`` is offered only ``subtract``, a row of ``spell`` only ``letter``. Each reward
reads its own game's instances and returns None for the others' ("does not apply", as in TRL), so
a row is scored by its game's reward alone.
"""

from __future__ import annotations


class Countdown:
    """Reach 0 from the row's ``start`` by subtracting."""

    def reset(self, start: int = 10, **row) -> str | None:
        self.value = int(start)
        self.done = False
        return f"The counter is at {self.value}."

    def subtract(self, amount: int) -> str:
        """Subtract from the counter.

        Args:
            amount: How much to take away.

        Returns:
            The counter's new value.
        """
        self.value -= int(amount)
        self.done = self.value == 0
        return f"The counter is at {self.value}."


class Spell:
    """Spell the row's ``word`` one letter at a time."""

    def reset(self, word: str = "cat", **row) -> str | None:
        self.word, self.spelled = word, ""
        return f"Spell '{word}'."

    def letter(self, char: str) -> str:
        """Add one letter.

        Args:
            char: The next letter.

        Returns:
            What has been spelled so far.
        """
        self.spelled += char
        return self.spelled


def countdown_reward(environments, **kwargs) -> list[float | None]:
    return [float(env.value == 0) if isinstance(env, Countdown) else None for env in environments]


def spell_reward(environments, **kwargs) -> list[float | None]:
    return [float(env.spelled == env.word) if isinstance(env, Spell) else None for env in environments]
