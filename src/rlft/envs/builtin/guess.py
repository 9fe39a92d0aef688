"""Find a secret number from too-low / too-high feedback: a task that takes several tool calls.

The calculator and search tasks need one call; here the model must read each result and let it
decide the next call, which is what multi-turn RL is for. The reward is the environment's own
(:meth:`GuessNumberEnv.get_reward`), not a comparison of the final text, because the number being
found by a guess is the success, whatever the model says afterwards.

Success alone is a sparse reward: a warm start that finds the number one time in seven gives most
groups the same reward for every episode, and GRPO learns nothing from them. ``progress_weight``
adds partial credit for an episode that narrowed the secret down without finding it: the share of
the bits of information it gathered, ``log(range / still_possible) / log(range)``, times the
weight. A guess that the earlier feedback had already ruled out gathers nothing, so the credit
rewards reading the feedback, which is the skill the task is about.
"""

from __future__ import annotations

import math
import random
from functools import cache

from rlft.envs.builtin import demo_messages

PHRASINGS = {
    "guess_direct": "Guess the secret number between {low} and {high}. After each guess you will be told whether "
    "it is too low, too high or correct.",
    "guess_thinking": "I'm thinking of a whole number from {low} to {high}. Find it in as few guesses as you can; "
    "after every guess I'll say if it is too low, too high or correct.",
    "guess_game": "Let's play a game: my number is between {low} and {high}, inclusive. Each time you guess, you "
    "will hear whether it is too low, too high or correct. What is my number?",
    "guess_lock": "A lock opens with a code from {low} to {high}. Try codes with the guess tool; each try tells "
    "you if the code is too low, too high or correct. Which code opens it?",
    "guess_short": "Find the hidden number ({low}-{high}). Feedback after each guess: too low, too high or correct.",
    "guess_hidden": "A number between {low} and {high} is hidden. Make guesses and use the feedback after each one "
    "(too low, too high or correct) to find it.",
}
# Demonstrations use only this; evaluation never does (see calculator.DEMO_PHRASING for why).
DEMO_PHRASING = {"guess": "guess_direct"}


class GuessNumberEnv:
    """One secret number in ``[low, high]``, taken from the row's ``secret``.

    ``progress_weight`` (0 to < 1): reward for an episode that ends without finding the number,
    per share of the information gathered (see the module's docstring); 0 keeps the reward binary.
    """

    def __init__(self, low: int = 1, high: int = 30, progress_weight: float = 0.0):
        if not low < high:
            raise ValueError(f"GuessNumberEnv needs low < high, got low={low}, high={high}")
        if not 0.0 <= progress_weight < 1.0:  # at 1 an unfound number would pay as much as a found one
            raise ValueError(f"GuessNumberEnv needs 0 <= progress_weight < 1, got {progress_weight}")
        self.low, self.high, self.progress_weight = low, high, progress_weight
        self.secret: int | None = None
        self.guesses = 0
        self.found = False
        self.done = False
        self.possible = (low, high)  # the secret's range that the feedback so far leaves open

    def reset(self, **row: object) -> str | None:
        secret = row.get("secret")
        if isinstance(secret, bool) or not isinstance(secret, int) or not self.low <= secret <= self.high:
            # a data row that does not fit the configured range is a bug in the data, not a model mistake
            raise ValueError(f"row 'secret' must be an integer from {self.low} to {self.high}, got {secret!r}")
        self.secret, self.guesses, self.found, self.done = secret, 0, False, False
        self.possible = (self.low, self.high)
        return None

    def guess(self, number: int) -> str:
        """Guess the secret number and hear whether it is too low, too high or correct.

        Args:
            number: The whole number you guess.
        """
        if self.found:
            return "error: you already found the number."
        value = _whole(number)
        if value is None:
            return f"error: guess a whole number from {self.low} to {self.high}."
        if not self.low <= value <= self.high:
            return f"error: the number is between {self.low} and {self.high}."
        self.guesses += 1
        lo, hi = self.possible
        if value < self.secret:
            self.possible = (max(lo, value + 1), hi)
            return "Too low."
        if value > self.secret:
            self.possible = (lo, min(hi, value - 1))
            return "Too high."
        self.found = self.done = True
        return "Correct!"

    def get_reward(self) -> float:
        """1.0 for a found number; else ``progress_weight`` times the share of the information gathered."""
        if self.found:
            return 1.0
        lo, hi = self.possible
        size = self.high - self.low + 1
        return self.progress_weight * math.log(size / (hi - lo + 1)) / math.log(size)


def _whole(number: object) -> int | None:
    """Accepts what a model plausibly sends for 17 (17, 17.0, "17"); None for anything else."""
    if isinstance(number, bool):
        return None
    if isinstance(number, int):
        return number
    if isinstance(number, float) and number.is_integer():
        return int(number)
    if isinstance(number, str) and number.strip().lstrip("-").isdigit():
        return int(number.strip())
    return None


def _rows(label: str, n: int, seed: int, phrasings: list[str], low: int, high: int) -> list[dict]:
    rng = random.Random(f"guess:{label}:{seed}")
    rows, cycle = [], []
    for _ in range(n):
        if not cycle:  # every phrasing once per round, in a shuffled order
            cycle = rng.sample(phrasings, len(phrasings))
        phrasing = cycle.pop()
        rows.append(
            {
                "prompt": PHRASINGS[phrasing].format(low=low, high=high),
                "secret": rng.randint(low, high),
                "phrasing": phrasing,
            }
        )
    return rows


def make_rows(split: str, n: int, seed: int, low: int = 1, high: int = 30) -> list[dict]:
    """Rows for RL. The secrets of train and eval overlap (there are only ``high - low + 1``), so
    evaluation holds out phrasings instead: ``eval`` never uses the demonstrations' phrasing,
    ``train`` uses all of them, that one included."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    phrasings = [p for p in PHRASINGS if split == "train" or p not in DEMO_PHRASING.values()]
    return _rows(split, n, seed, phrasings, low, high)


def demo_rows(n: int, seed: int, low: int = 1, high: int = 30) -> list[dict]:
    return _rows("demo", n, seed, list(DEMO_PHRASING.values()), low, high)


@cache
def tool_schemas() -> list[dict]:
    from rlft.envs.tools import schemas_of

    return schemas_of(GuessNumberEnv, [])


def demonstration(row: dict, **env_kwargs: int) -> dict:
    """The expert: binary search over the environment's range, at most log2(range) + 1 guesses."""
    env = GuessNumberEnv(**env_kwargs)
    env.reset(**row)
    lo, hi, steps = env.low, env.high, []
    while not env.done:
        if lo > hi:
            raise ValueError(f"binary search lost the secret {row['secret']!r}")
        mid = (lo + hi) // 2
        result = env.guess(mid)
        steps.append(("guess", {"number": mid}, result))
        if result == "Too low.":
            lo = mid + 1
        elif result == "Too high.":
            hi = mid - 1
        elif result != "Correct!":
            raise ValueError(f"guess({mid}) answered {result!r}")
    return {"messages": demo_messages(row["prompt"], steps, f"The number is {env.secret}."), "tools": tool_schemas()}
