"""The environment section unpacked for the RL job: rewards, prompts with a reset observation."""

from __future__ import annotations

from rlft.config.schema import RLConfig
from rlft.rl.episodes import prompt_with_observation, reward_manager, row_of


def _cfg(tmp_path, functions, env):
    (tmp_path / "t.jsonl").write_text('{"prompt": "hi"}\n')
    return RLConfig.model_validate(
        {"data": {"train_file": str(tmp_path / "t.jsonl")}, "reward": {"functions": functions}, "environment": env}
    )


def test_environment_reward_alone_or_after_the_configured_ones(tmp_path):
    alone = reward_manager(_cfg(tmp_path, [], {"class": "guess_number"}))
    assert alone.names == ["environment"]
    scored = alone.score(["p", "q"], ["a", "b"], {"environment_reward": [1.0, 0.0]})
    assert scored.total.tolist() == [1.0, 0.0]
    both = reward_manager(
        _cfg(tmp_path, [{"type": "contains", "keyword": "a"}], {"class": "guess_number", "reward_weight": 0.5})
    )
    assert both.names == ["contains", "environment"] and both.weights["environment"] == 0.5
    # a class without get_reward adds nothing
    assert reward_manager(_cfg(tmp_path, [{"type": "contains", "keyword": "a"}], {"class": "calculator"})).names == [
        "contains"
    ]


class _Ex:
    prompt, text, columns = "What is 2+2?", "<formatted>", {"answer": "4"}


def test_reset_observation_is_appended_to_the_last_user_turn(tmp_path):
    from rlft.chat.templates import HERMES_TEMPLATE
    from rlft.models.tiny import build_tiny_tokenizer

    cfg = _cfg(tmp_path, [], {"class": "guess_number"})
    tok = build_tiny_tokenizer(chat_format="chatml")
    tok.chat_template = HERMES_TEMPLATE
    assert prompt_with_observation(_Ex, None, cfg.data, tok, None) == "<formatted>"
    text = prompt_with_observation(_Ex, "Board: 3x3", cfg.data, tok, None)
    assert "What is 2+2?\n\nBoard: 3x3<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert row_of(_Ex, cfg.data) == {"answer": "4", "prompt": "What is 2+2?"}


def test_several_classes_offer_each_prompt_its_own_tools_and_a_stray_row_names_its_line(tmp_path):
    """environment.classes: each prompt is rendered with the tools of the class its column names; a
    row naming no class is a data error with its file and line, before any episode runs."""
    import pytest

    from rlft.data.prompts import load_prompts
    from rlft.errors import DataError
    from rlft.models.tiny import build_tiny_tokenizer
    from rlft.rl.episodes import env_tools, rewards_want_environments

    games = "examples/trl/two_games.py"
    rows = '{"prompt": "a", "env": "countdown", "start": 3}\n{"prompt": "b", "env": "spell", "word": "ox"}\n'
    (tmp_path / "g.jsonl").write_text(rows)
    cfg = RLConfig.model_validate(
        {
            "data": {"train_file": str(tmp_path / "g.jsonl")},
            "reward": {"functions": [{"type": "custom", "function": f"{games}:spell_reward"}]},
            "environment": {"classes": {"countdown": f"{games}:Countdown", "spell": f"{games}:Spell"}},
        }
    )
    tok = build_tiny_tokenizer(chat_format="chatml")
    first, second = load_prompts(cfg.data, tok, "train", 0, env_tools(cfg)).examples
    assert '"subtract"' in first.text and '"letter"' not in first.text
    assert '"letter"' in second.text and '"subtract"' not in second.text
    assert rewards_want_environments(cfg)  # spell_reward(environments, **kwargs)
    assert reward_manager(cfg).names == ["spell_reward"]

    (tmp_path / "g.jsonl").write_text(rows + '{"prompt": "c", "env": "chess"}\n')
    with pytest.raises(DataError, match=r"g.jsonl line 3: column 'env' is 'chess'; .*: countdown, spell"):
        load_prompts(cfg.data, tok, "train", 0, env_tools(cfg))
