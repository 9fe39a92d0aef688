"""Which tokens of a conversation are trained: one implementation for SFT and multi-turn RL.

The model is trained on what it would generate itself: in every assistant turn (or only the last,
with ``train_on="last_assistant"``) the tokens after the generation prompt, up to and including the
end-of-turn token. Everything else -- the system turn with its tool schemas, user turns, tool
results, the ``<|im_start|>assistant`` header and the template's glue after an end-of-turn token --
is context: attended to, never trained on.

The spans come from rendering the conversation turn by turn (so the template decides where a turn
starts and ends, whatever it is) and are mapped onto the tokens of the whole rendering through the
tokenizer's character offsets, so the token ids are exactly those of the whole conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlft.chat.templates import TemplateError, render


@dataclass
class TokenizedChat:
    """input_ids, loss_mask (1 = trained), turn_index (the message each token belongs to): [L] lists."""

    input_ids: list[int]
    loss_mask: list[int]
    turn_index: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.loss_mask)


@dataclass
class _Span:
    start: int
    end: int
    turn: int
    trained: bool


def _spans(tokenizer, messages: list[dict], tools: list[dict] | None, train_on: str) -> tuple[str, list[_Span]]:
    """The whole rendering and its character spans (one per message, three per assistant message:
    header, generated part, glue), in order."""
    full = render(tokenizer, messages, tools=tools)

    def prefix_length(k: int, generation: bool = False) -> int:
        head = render(tokenizer, messages[:k], tools=tools, add_generation_prompt=generation)
        if not full.startswith(head):
            raise TemplateError(
                f"the chat template does not preserve prefixes: the first {k} messages render "
                f"differently alone than inside the whole conversation"
            )
        return len(head)

    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    trained_turns = set(assistants[-1:] if train_on == "last_assistant" else assistants)
    spans, pos = [], 0
    for i, msg in enumerate(messages):
        end = prefix_length(i + 1) if i + 1 < len(messages) else len(full)
        if msg["role"] == "assistant":
            start = prefix_length(i, generation=True)
            stop = _end_of_generation(full, start, end, tokenizer.eos_token)
            spans += [
                _Span(pos, start, i, False),
                _Span(start, stop, i, i in trained_turns),
                _Span(stop, end, i, False),
            ]
        else:
            spans.append(_Span(pos, end, i, False))
        pos = end
    return full, [s for s in spans if s.end > s.start]


def _end_of_generation(text: str, start: int, end: int, eos: str | None) -> int:
    """Where the model stops generating in ``text[start:end]``: just after the last end-of-turn token
    (the template's newline after it is glue the model never produces); the span's end without one."""
    if eos:
        at = text.rfind(eos, start, end)
        if at >= 0:
            return at + len(eos)
    return end


def tokenize_chat(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    train_on: Literal["assistant", "last_assistant"] = "assistant",
) -> TokenizedChat:
    """Token ids of the whole conversation with its loss mask and turn index.

    Raises TemplateError if a trained span does not start and end on token boundaries (the
    tokens the model generates would not be the trained ones)."""
    full, spans = _spans(tokenizer, messages, tools, train_on)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    starts, ends = {s for s, _ in offsets}, {e for _, e in offsets}
    for span in spans:
        if span.trained and not (span.start in starts and span.end in ends):
            raise TemplateError(
                f"a token crosses the start or end of assistant message {span.turn} "
                f"({full[span.start : span.end][:60]!r}); the tokens the model generates would not "
                f"be the trained ones"
            )
    mask, turns, k = [], [], 0
    for s, _ in offsets:
        while k + 1 < len(spans) and s >= spans[k].end:
            k += 1
        mask.append(int(spans[k].trained))
        turns.append(spans[k].turn)
    return TokenizedChat(list(ids), mask, turns)
