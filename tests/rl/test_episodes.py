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
