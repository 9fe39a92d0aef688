"""Which tokens of a conversation are trained: exactly the assistant's own, nothing else."""

from __future__ import annotations

import pytest

from rlft.chat.render import tokenize_chat
from rlft.chat.templates import HERMES_TEMPLATE, TemplateError, check_prefix_preservation, render
from rlft.models.tiny import build_tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
CHAT = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 6 * 7?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}],
    },
    {"role": "tool", "name": "calculator", "content": "42"},
    {"role": "assistant", "content": "6 * 7 = 42."},
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call><|im_end|>'
ANSWER = "6 * 7 = 42.<|im_end|>"


@pytest.fixture
def tok():
    tokenizer = build_tiny_tokenizer(chat_format="chatml")
    tokenizer.chat_template = HERMES_TEMPLATE
    return tokenizer


def _runs(tok, chat: list[int], values: list[int]) -> list[tuple[int, str]]:
    """(value, decoded text) of each run of equal values."""
    out: list[tuple[int, list[int]]] = []
    for token, v in zip(chat, values):
        if out and out[-1][0] == v:
            out[-1][1].append(token)
        else:
            out.append((v, [token]))
    return [(v, tok.decode(ids)) for v, ids in out]


def test_loss_mask_is_exactly_the_assistant_tokens(tok):
    chat = tokenize_chat(tok, CHAT, tools=TOOLS)
    full = render(tok, CHAT, tools=TOOLS)
    assert tok.decode(chat.input_ids) == full  # the ids are those of the whole rendering
    trained = [text for v, text in _runs(tok, chat.input_ids, chat.loss_mask) if v == 1]
    assert trained == [CALL, ANSWER]  # the tool call and the answer, each with its end-of-turn token
    untrained = "".join(text for v, text in _runs(tok, chat.input_ids, chat.loss_mask) if v == 0)
    for context in (
        "Use the calculator.",
        "What is 6 * 7?",
        "<tool_response>\n42\n</tool_response>",
        "<|im_start|>assistant\n",
        "<tools>",
    ):
        assert context in untrained
    assert chat.num_trained == len(tok(CALL + ANSWER, add_special_tokens=False)["input_ids"])


def test_turn_index_follows_the_messages(tok):
    chat = tokenize_chat(tok, CHAT, tools=TOOLS)
    runs = _runs(tok, chat.input_ids, chat.turn_index)
    assert [t for t, _ in runs] == [0, 1, 2, 3, 4]
    assert runs[3][1].startswith("<|im_start|>user\n<tool_response>")
    assert runs[4][1] == "<|im_start|>assistant\n" + ANSWER + "\n"


def test_train_on_last_assistant_only(tok):
    chat = tokenize_chat(tok, CHAT, tools=TOOLS, train_on="last_assistant")
    assert [text for v, text in _runs(tok, chat.input_ids, chat.loss_mask) if v == 1] == [ANSWER]


def test_prompt_response_row_with_the_models_own_template():
    tok = build_tiny_tokenizer(chat_format="chatml")  # SmolLM2-like: a default system turn, no tools
    chat = tokenize_chat(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    assert [text for v, text in _runs(tok, chat.input_ids, chat.loss_mask) if v == 1] == ["Hello!<|im_end|>"]
    assert tok.decode(chat.input_ids).startswith("<|im_start|>system\nYou are a tiny test model.")


def test_trained_tokens_are_what_generation_continues_with(tok):
    """The prompt the model sees when it generates tokenizes as the training sequence's prefix."""
    chat = tokenize_chat(tok, CHAT, tools=TOOLS)
    prompt = render(tok, CHAT[:2], tools=TOOLS, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert chat.input_ids[: len(prompt_ids)] == prompt_ids
    assert chat.loss_mask[len(prompt_ids) - 1] == 0 and chat.loss_mask[len(prompt_ids)] == 1


def test_template_that_rewrites_earlier_turns_is_refused(tok):
    # Like reasoning templates that drop earlier turns' <think> blocks: the last assistant turn is rendered
    # in full, earlier ones without their reasoning -- so a prefix renders differently inside the whole chat.
    tok.chat_template = (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    chat = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>hmm</think>A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>ok</think>A2"},
    ]
    with pytest.raises(TemplateError, match="does not preserve prefixes"):
        check_prefix_preservation(tok, chat)
    with pytest.raises(TemplateError, match="does not preserve prefixes"):
        tokenize_chat(tok, chat)


def test_the_shipped_templates_preserve_prefixes(tok):
    check_prefix_preservation(tok)  # Hermes, with a tool call
    check_prefix_preservation(build_tiny_tokenizer(chat_format="chatml"))  # a plain ChatML template
