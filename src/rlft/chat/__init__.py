"""Chat formatting shared by SFT and RL: conversations, templates, trained tokens, tool calls.

* :mod:`rlft.chat.messages` -- the Hugging Face chat format, checked (``normalise_messages``)
* :mod:`rlft.chat.templates` -- choosing a template, the Hermes tool template, the prefix check
* :mod:`rlft.chat.render` -- ``tokenize_chat``: token ids, loss mask and turn index of a conversation
* :mod:`rlft.chat.tool_calls` -- ``parse_tool_calls``: calls out of generated text
"""
