"""SFT on the real built-in SmolLM2-135M-Instruct: its tokenizer with the Hermes template, and two steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft import Trainer
from tests.conftest import read_jsonl, write_jsonl

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
DEMO = Path(__file__).resolve().parents[2] / "data" / "tool_sft_train.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    from rlft.models.loading import load_tokenizer
    from rlft.models.sources import resolve_model_dir

    return load_tokenizer(resolve_model_dir("smollm2-135m-instruct"))


def test_smollm2_needs_and_gets_the_hermes_template(tokenizer):
    from rlft.chat.render import tokenize_chat
    from rlft.chat.templates import check_prefix_preservation, choose_template, supports_tools

    assert not supports_tools(tokenizer, tokenizer.chat_template)  # its own renders role and content only
    template, label = choose_template("auto", tokenizer, needs_tools=True)
    assert label.startswith("hermes")
    tokenizer.chat_template = template
    check_prefix_preservation(tokenizer)  # text and BPE tokens
    row = json.loads(DEMO.read_text().splitlines()[0])
    chat = tokenize_chat(tokenizer, row["messages"], tools=row["tools"])
    trained = [t for t, m in zip(chat.input_ids, chat.loss_mask) if m]
    call, answer = row["messages"][1]["tool_calls"][0]["function"], row["messages"][3]["content"]
    expected = (
        f'<tool_call>\n{{"name": "calculator", "arguments": {json.dumps(call["arguments"])}}}\n'
        f"</tool_call><|im_end|>{answer}<|im_end|>"
    )
    assert tokenizer.decode(trained) == expected


def test_two_sft_steps_on_smollm2(tmp_path):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()[:2]]
    data = write_jsonl(tmp_path / "calc.jsonl", rows)
    # one of the trained rows is enough to see the loss fall
    held = write_jsonl(tmp_path / "eval.jsonl", rows[:1])
    config = {
        "kind": "sft",
        "model": {"path": "smollm2-135m-instruct", "dtype": "fp32"},
        "data": {"train_file": str(data), "eval_file": str(held), "messages_field": "messages", "max_length": 600},
        # a step is one ~250-token row (the real model's forward and backward are most of this test)
        "sft": {"learning_rate": 1e-4, "batch_size": 1, "micro_batch_size": 1, "packing": False},
        "train": {
            "max_steps": 2,
            "save_optimizer": False,  # the weights and template are what is checked; AdamW's 1.1 GB is not
            "logging_interval": 1,
            "output_dir": str(tmp_path / "outputs"),
            "seed": 0,
            "progress_bar": "off",
        },
    }
    result = Trainer(config=config).train()
    assert result.eval_after.loss < result.eval_before.loss
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl")] == [1, 2]
    assert "<tool_call>" in (result.final_checkpoint / "chat_template.jinja").read_text()
