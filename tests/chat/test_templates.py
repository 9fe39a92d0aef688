"""Choosing the chat template: the model's own unless tools need Hermes; clear refusals otherwise."""

from __future__ import annotations

import pytest

from rlft.chat.templates import HERMES_TEMPLATE, NAMES, TemplateError, choose_template, supports_tools
from rlft.config.schema import CHAT_TEMPLATE_NAMES
from rlft.models.tiny import build_tiny_tokenizer


def test_config_names_match_the_templates():
    assert CHAT_TEMPLATE_NAMES == NAMES


def test_a_role_and_content_template_does_not_support_tools():
    tok = build_tiny_tokenizer(chat_format="chatml")
    assert not supports_tools(tok, tok.chat_template)
    assert supports_tools(tok, HERMES_TEMPLATE)


def test_auto_keeps_the_models_template_without_tools_and_switches_for_tools():
    tok = build_tiny_tokenizer(chat_format="chatml")
    own = tok.chat_template
    assert choose_template("auto", tok, needs_tools=False) == (own, "the tokenizer's own")
    template, label = choose_template("auto", tok, needs_tools=True)
    assert template == HERMES_TEMPLATE and label.startswith("hermes")
    assert choose_template("tokenizer", tok, needs_tools=True)[0] == own  # asked for: kept, even without tools


def test_a_template_that_supports_tools_is_kept():
    tok = build_tiny_tokenizer(chat_format="chatml")
    tok.chat_template = HERMES_TEMPLATE + "{# the model's own, tool-aware #}"
    assert choose_template("auto", tok, needs_tools=True)[0] == tok.chat_template


def test_hermes_refused_where_turns_do_not_end_with_im_end():
    tok = build_tiny_tokenizer()  # <eos> ends turns, no ChatML tokens
    with pytest.raises(TemplateError, match="not a ChatML model"):
        choose_template("auto", tok, needs_tools=True)
    with pytest.raises(TemplateError, match="end-of-sequence token is '<eos>'"):
        choose_template("hermes", tok, needs_tools=False)


def test_template_from_a_file(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert choose_template(str(path), build_tiny_tokenizer(), needs_tools=False) == (path.read_text(), f"file {path}")


def test_no_template_means_plain_text_unless_tools_are_needed():
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    assert choose_template("auto", tok, needs_tools=False)[0] is None
    with pytest.raises(TemplateError, match="no chat template"):
        choose_template("auto", tok, needs_tools=True)
