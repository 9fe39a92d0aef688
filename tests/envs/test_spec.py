"""Loading tools and environment classes written as TRL's docs show them, unchanged."""

from __future__ import annotations

import pytest

from rlft.envs.spec import EnvironmentSession, EnvironmentSpec
from rlft.errors import EnvironmentFailure

TOOLS = '''
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: What to shout.
    """
    return text.upper()


def undocumented(x):
    return x
'''

ENV = '''
class WordEnv:
    def reset(self, **row):
        self.word = row["word"]
        self.tries = 0
        return f"The word has {len(self.word)} letters."

    def check(self, guess: str) -> str:
        """Check a guess.

        Args:
            guess: The guessed word.
        """
        self.tries += 1
        return "correct" if guess == self.word else "wrong"

    def get_reward(self) -> float:
        return 1.0 / self.tries if self.tries else 0.0

    def _helper(self):
        pass
'''


@pytest.fixture
def files(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS)
    (tmp_path / "my_env.py").write_text(ENV)
    return tmp_path


def test_plain_tools_sync_and_async(files):
    spec = EnvironmentSpec.load(None, [f"{files}/my_tools.py:multiply", f"{files}/my_tools.py:shout"])
    assert spec.tool_names == ["multiply", "shout"] and not spec.has_reward
    fn = spec.schemas[0]["function"]
    assert fn["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first factor."}
    session = EnvironmentSession(spec)
    assert session.reset({"prompt": "x"}, 0) is None
    assert session.call("multiply", {"a": 6, "b": 7}) == "42"
    assert session.call("shout", {"text": "hi"}) == "HI"


def test_trl_environment_class(files):
    spec = EnvironmentSpec.load(f"{files}/my_env.py:WordEnv", [])
    assert spec.tool_names == ["check"] and spec.has_reward
    session = EnvironmentSession(spec)
    assert session.reset({"word": "cat"}, 0) == "The word has 3 letters."
    assert session.call("check", {"guess": "dog"}) == "wrong"
    assert session.call("check", {"guess": "cat"}) == "correct"
    assert session.reward() == 0.5


def test_tool_without_docstring_is_a_named_error(files):
    with pytest.raises(EnvironmentFailure, match=r"tool 'undocumented': no JSON schema.*Google-style docstring"):
        EnvironmentSpec.load(None, [f"{files}/my_tools.py:undocumented"])
    with pytest.raises(EnvironmentFailure, match=r"environment class '.*nope.py:X': file not found"):
        EnvironmentSpec.load(f"{files}/nope.py:X", [])
    with pytest.raises(EnvironmentFailure, match="offered twice"):
        EnvironmentSpec.load(None, [f"{files}/my_tools.py:multiply", f"{files}/my_tools.py:multiply"])
