"""Which chat template a run uses, a tool-calling template for ChatML models, and the start-up check.

``data.chat_template`` chooses: ``tokenizer`` (the model's own), ``hermes`` (below), a ``.jinja``
file, or ``auto`` -- the model's own template unless the data uses tools and that template cannot
render them (SmolLM2-135M-Instruct's renders only role and content: tool calls vanish and a tool
result comes out as a bare ``<|im_start|>tool`` turn), in which case Hermes. The chosen template is
set on the tokenizer, so generation, evaluation and every saved checkpoint use the same one.

Every template is checked at start-up: rendering a conversation turn by turn must give the same
text, and the same tokens, as rendering it whole. A template that rewrites earlier turns (one that
drops past reasoning, say) would train the model on other tokens than it sees when it generates,
so it is refused with an explanation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlft.chat.tool_calls import CLOSE, OPEN

END_OF_TURN = "<|im_end|>"

# Hermes-style tool calling on ChatML: tool schemas in the system turn, calls as JSON between
# <tool_call> tags in the assistant turn, each result in a user turn between <tool_response> tags.
# One turn per tool result (not one for all of a round's results) keeps the template prefix-preserving.
HERMES_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}{%- set system = messages[0]['content'] -%}"
    "{%- else -%}{%- set system = none -%}{%- endif -%}"
    "{%- if system is not none or tools -%}"
    "{{- '<|im_start|>system\\n' + (system if system is not none else 'You are a helpful assistant.') -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nTools (JSON schemas):\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}{{- '\\n' -}}"
    "{%- endfor -%}"
    '{{- \'</tools>\\nTo call one, reply with {"name": <tool name>, "arguments": {...}} between '
    + OPEN
    + " and "
    + CLOSE
    + ". Results come back between <tool_response> and </tool_response>.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '" + OPEN + "\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' + (fn['arguments'] | tojson)"
    " + '}\\n" + CLOSE + "' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# For models without a chat template (data.use_chat_template: false in SFT): every turn's text on its own,
# the assistant's followed by the end-of-sequence token so the model learns where to stop.
PLAIN_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}"
    "{%- else -%}{{- message['content'] + '\n\n' -}}{%- endif -%}"
    "{%- endfor -%}"
)

TEMPLATES = {"hermes": HERMES_TEMPLATE}
NAMES = ("auto", "tokenizer", *TEMPLATES)  # config.sections.CHAT_TEMPLATE_NAMES lists the same


class TemplateError(ValueError):
    """The chosen chat template cannot be used; the message says why and what to do."""


def render(
    tokenizer, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = False
) -> str:
    """The tokenizer's chat template applied to ``messages`` (and ``tools``), as text."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected a string")
    return text


# A conversation using every role, with a tool call and its result, for the checks below.
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
_PROBE = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Hello there."},
    # Reasoning in an earlier turn: templates that drop it from past turns fail the prefix check.
    {"role": "assistant", "content": "<think>A greeting.</think>Hi! How can I help?"},
    {"role": "user", "content": "Look up probe_word_x."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "probe_lookup", "arguments": {"word": "probe_word_x"}}}
        ],
    },
    {"role": "tool", "name": "probe_lookup", "content": "probe_result_y"},
    {"role": "assistant", "content": "It means probe_result_y."},
]


def supports_tools(tokenizer, template: str) -> bool:
    """Whether ``template`` renders tool schemas, tool calls and tool results (it is tried on a probe)."""
    try:
        text = _with_template(tokenizer, template, lambda: render(tokenizer, _PROBE, tools=[_PROBE_TOOL]))
    except Exception:  # noqa: BLE001 - a template that cannot even render the probe does not support tools
        return False
    return all(s in text for s in ("probe_lookup", "probe_word_x", "probe_result_y", "Look a word up."))


def choose_template(setting: str, tokenizer, *, needs_tools: bool) -> tuple[str | None, str]:
    """(template source, label for the log) for ``data.chat_template``; TemplateError when none fits.

    A tokenizer without a template, under ``auto`` and without tools, gives (None, ...): prompts are
    then plain text, as they always were for such models."""
    own = getattr(tokenizer, "chat_template", None)
    if not own and setting == "auto" and not needs_tools:
        return None, "none: the tokenizer has no chat template, prompts are plain text"
    if setting in TEMPLATES:
        return _checked_builtin(setting, tokenizer), setting
    if setting not in ("auto", "tokenizer"):
        path = Path(setting)
        return path.read_text(encoding="utf-8"), f"file {path}"
    if not own:
        raise TemplateError(
            "the tokenizer has no chat template; set data.chat_template to a .jinja file (or "
            "data.use_chat_template: false for plain text)"
        )
    if setting == "tokenizer" or not needs_tools or supports_tools(tokenizer, own):
        return own, "the tokenizer's own"
    if END_OF_TURN not in tokenizer.get_vocab():
        raise TemplateError(
            "the data uses tools but the tokenizer's chat template cannot render tool calls or "
            "tool results, and this is not a ChatML model, so the built-in Hermes template does "
            "not fit either; set data.chat_template to a .jinja template that renders tools"
        )
    return _checked_builtin("hermes", tokenizer), "hermes (the tokenizer's own cannot render tools)"


def _checked_builtin(name: str, tokenizer) -> str:
    if END_OF_TURN not in tokenizer.get_vocab() or tokenizer.eos_token != END_OF_TURN:
        raise TemplateError(
            f"data.chat_template: {name} is a ChatML template whose turns end with {END_OF_TURN}, "
            f"but this tokenizer's end-of-sequence token is {tokenizer.eos_token!r}; generation "
            f"would not stop at the end of a turn"
        )
    return TEMPLATES[name]


def _with_template(tokenizer, template: str, fn) -> Any:
    old = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        return fn()
    finally:
        tokenizer.chat_template = old


def check_prefix_preservation(
    tokenizer, conversation: list[dict] | None = None, tools: list[dict] | None = None
) -> None:
    """Refuse (TemplateError) the tokenizer's template if rendering ``conversation`` (default: a probe
    with every role and, when the template supports them, a tool call) turn by turn differs from
    rendering it whole, in text or in tokens."""
    if conversation is None:
        has_tools = supports_tools(tokenizer, tokenizer.chat_template)
        conversation = _PROBE if has_tools else [m for m in _PROBE[:4]] + [_PROBE[2]]
        tools = [_PROBE_TOOL] if has_tools else None
    full = render(tokenizer, conversation, tools=tools)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    for k in range(1, len(conversation)):
        gen = conversation[k]["role"] == "assistant"
        head = render(tokenizer, conversation[:k], tools=tools, add_generation_prompt=gen)
        if not full.startswith(head):
            at = next((i for i, (a, b) in enumerate(zip(head, full)) if a != b), min(len(head), len(full)))
            raise TemplateError(
                f"the chat template does not preserve prefixes: the first {k} turns render as "
                f"...{head[at - 40 : at + 40]!r} "
                f"but inside the whole conversation as ...{full[at - 40 : at + 40]!r}. Training on such a template "
                f"teaches other text than the model sees when it generates; use a template that renders every "
                f"turn the same whatever follows (data.chat_template: path/to/template.jinja)"
            )
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        if full_ids[: len(head_ids)] != head_ids:
            raise TemplateError(
                f"the chat template's text is prefix-preserving but its tokens are not: the first {k} turns "
                f"tokenize differently alone than inside the whole conversation (a token crosses the turn "
                f"boundary), so generated tokens would not be the trained ones; end every turn on a special "
                f"token or a newline"
            )
