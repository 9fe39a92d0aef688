"""Reading Hermes tool calls out of generated text, and the chat-format checks."""

from __future__ import annotations

import pytest

from rlft.chat.messages import MessageError, normalise_messages, uses_tools
from rlft.chat.tool_calls import ToolCall, check_call, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


def test_well_formed_calls_and_content():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    turn = parse_tool_calls(text)
    assert turn.calls == [ToolCall("calculator", {"expression": "2+3"})]
    assert turn.errors == [] and turn.content == "Let me compute."


@pytest.mark.parametrize(
    "text, error",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}', "unmatched <tool_call>"),
        ("<tool_call>calculator(2+3)</tool_call>", "call 0: not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "'name' string"),
        ('<tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>', "'arguments' must be an object"),
    ],
)
def test_malformed_calls_are_reported(text, error):
    turn = parse_tool_calls(text)
    assert turn.calls == [] and any(error in e for e in turn.errors), turn.errors


def test_calls_checked_against_the_schema():
    assert check_call(ToolCall("calculator", {"expression": "1"}), TOOLS) is None
    assert "unknown tool 'search'" in check_call(ToolCall("search", {}), TOOLS)
    assert "missing required argument(s) expression" in check_call(ToolCall("calculator", {}), TOOLS)
    assert "unknown argument(s) x" in check_call(ToolCall("calculator", {"expression": "1", "x": 2}), TOOLS)


def test_messages_normalised():
    chat = normalise_messages(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "calculator", "arguments": '{"expression": "1"}'}}],
            },
            {"role": "tool", "content": "1"},
        ]
    )
    assert chat[1]["content"] == "" and chat[1]["tool_calls"][0] == {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1"}},
    }
    assert uses_tools(chat) and not uses_tools(chat[:1])


@pytest.mark.parametrize(
    "chat, problem",
    [
        ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}], "only assistant messages"),
        ([{"role": "assistant", "tool_calls": []}], "non-empty list"),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], "tool_calls\\[0\\] must be"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}], "not JSON"),
        ([{"role": "tool", "content": None}], "content must be a string"),
    ],
)
def test_bad_messages(chat, problem):
    with pytest.raises(MessageError, match=problem):
        normalise_messages(chat)
