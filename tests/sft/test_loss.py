"""The SFT loss: only marked tokens go through the head, packing changes nothing, micro-batches add up."""

from __future__ import annotations

import torch

from rlft.algorithms import sft_loss
from rlft.config.schema import ModelConfig
from rlft.config.sft import SFTDataConfig
from rlft.models.loading import load_policy, load_tokenizer
from rlft.models.logprobs import marked_token_logprobs
from rlft.sft.batch import collate
from rlft.sft.data import load_sft, training_rows
from tests.conftest import write_jsonl
from tests.sft.conftest import calculator_chat


def _setup(tmp_path, model_dir, n=5):
    model = load_policy(ModelConfig(path=str(model_dir), dtype="fp32"), torch.device("cpu"), model_dir=model_dir)
    tok = load_tokenizer(model_dir)
    rows = [calculator_chat(a, a + 1) for a in range(1, n + 1)] + [
        {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]}
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    data = load_sft(SFTDataConfig(train_file=str(path), messages_field="messages", max_length=4000), tok, "train", 0)
    return model, tok, data.examples


def _loss_and_grad(model, rows, pad_id, micro=None):
    model.zero_grad()
    num_tokens = float(sum(int(r.loss_mask[1:].sum()) for r in rows))
    micro = micro or len(rows)
    total = 0.0
    for i in range(0, len(rows), micro):
        b = collate(rows[i : i + micro], pad_id)
        loss = sft_loss(
            marked_token_logprobs(model, b.input_ids, b.attention_mask, b.position_ids, b.loss_mask),
            num_tokens=num_tokens,
        )
        loss.backward()
        total += float(loss.detach())
    return total, model.model.layers[0].self_attn.q_proj.weight.grad.clone()


def test_marked_logprobs_equal_a_full_forward(tmp_path, chatml_model_dir):
    model, tok, examples = _setup(tmp_path, chatml_model_dir, n=2)
    b = collate(training_rows(examples, 4000, packing=False), tok.pad_token_id)
    with torch.no_grad():
        got = marked_token_logprobs(model, b.input_ids, b.attention_mask, b.position_ids, b.loss_mask)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    full = torch.log_softmax(logits[:, :-1], -1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    expected = full[b.loss_mask[:, 1:].bool()]
    assert got.shape == expected.shape and got.numel() == b.num_trained
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_packing_gives_the_same_loss_and_gradient(tmp_path, chatml_model_dir):
    model, tok, examples = _setup(tmp_path, chatml_model_dir)
    packed = training_rows(examples, 4000, packing=True)
    single = training_rows(examples, 4000, packing=False)
    assert len(packed) < len(single)
    loss_p, grad_p = _loss_and_grad(model, packed, tok.pad_token_id)
    loss_s, grad_s = _loss_and_grad(model, single, tok.pad_token_id)
    assert abs(loss_p - loss_s) < 1e-5 * abs(loss_s)
    torch.testing.assert_close(grad_p, grad_s, atol=1e-6, rtol=1e-4)


def test_micro_batches_add_up_to_the_batch(tmp_path, chatml_model_dir):
    model, tok, examples = _setup(tmp_path, chatml_model_dir)
    rows = training_rows(examples, 4000, packing=False)
    loss_1, grad_1 = _loss_and_grad(model, rows, tok.pad_token_id)
    loss_3, grad_3 = _loss_and_grad(model, rows, tok.pad_token_id, micro=2)
    assert abs(loss_1 - loss_3) < 1e-5 * abs(loss_1)
    torch.testing.assert_close(grad_1, grad_3, atol=1e-6, rtol=1e-4)


def test_gradient_checkpointing_gives_the_same_loss_and_gradient(tmp_path, chatml_model_dir):
    model, tok, examples = _setup(tmp_path, chatml_model_dir, n=3)
    ckpt = load_policy(
        ModelConfig(path=str(chatml_model_dir), dtype="fp32", gradient_checkpointing=True),
        torch.device("cpu"),
        model_dir=chatml_model_dir,
    )
    rows = training_rows(examples, 4000, packing=True)
    loss_a, grad_a = _loss_and_grad(model.train(), rows, tok.pad_token_id)
    loss_b, grad_b = _loss_and_grad(ckpt.train(), rows, tok.pad_token_id)
    assert abs(loss_a - loss_b) < 1e-6 * abs(loss_a)
    torch.testing.assert_close(grad_a, grad_b, atol=1e-7, rtol=1e-5)
