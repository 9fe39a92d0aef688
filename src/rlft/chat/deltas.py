"""The text a multi-turn episode appends after a model turn: the chat template's delta, never a
re-rendering of the transcript.

The model's sampled tokens stay exactly as sampled. What follows them -- the end of the assistant
turn (when generation stopped at a tool call, before the model's own end-of-turn token), the tool
results as the template renders them, and the next assistant header -- is found by rendering a
fixed stand-in conversation with and without the tool messages and taking the difference.
"""

from __future__ import annotations

from rlft.chat.templates import TemplateError, render

_MARK = "\u2063rlft-turn\u2063"  # a stand-in assistant reply no template rewrites


class TurnDeltas:
    """Deltas for one tokenizer's template and one set of tools."""

    def __init__(self, tokenizer, tools: list[dict] | None):
        self.tokenizer, self.tools = tokenizer, tools
        self._base = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
        self._base_text = render(tokenizer, self._base, tools=tools)
        at = self._base_text.rfind(_MARK)
        if at < 0:
            raise TemplateError("the chat template does not render the assistant's content")
        self.closing = self._base_text[at + len(_MARK) :]
        self.eos_text = tokenizer.eos_token or ""

    def after_turn(self, tool_messages: list[dict], ended_with_eos: bool) -> str:
        """The text after a model turn that ended (with its own end-of-turn token if
        ``ended_with_eos``) and was answered by ``tool_messages``, up to the next assistant header."""
        text = render(self.tokenizer, self._base + tool_messages, tools=self.tools, add_generation_prompt=True)
        if not text.startswith(self._base_text):
            raise TemplateError(
                "the chat template renders earlier turns differently once tool results follow; "
                "multi-turn episodes need a prefix-preserving template"
            )
        closing = self.closing
        if ended_with_eos and self.eos_text and closing.startswith(self.eos_text):
            closing = closing[len(self.eos_text) :]
        return closing + text[len(self._base_text) :]
