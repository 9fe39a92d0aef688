"""``type: judge``: score parsing, unparsable verdicts counted (never a silent 0), group mode, a local
judge model and an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlft.config.rewards import JudgeReward
from rlft.errors import RewardError
from rlft.rewards.judge import JudgeRewardFunction, parse_group_scores, parse_score
from rlft.rewards.manager import RewardManager

PATTERN = JudgeReward(type="judge", url="http://x").score_pattern


def test_parse_score():
    assert parse_score("Score: 7", PATTERN, (0, 10)) == 0.7
    assert parse_score("the score=10.", PATTERN, (0, 10)) == 1.0
    assert parse_score("SCORE 2.5", PATTERN, (0, 10)) == 0.25
    assert parse_score("I would give it 7/10", PATTERN, (0, 10)) is None  # no score to read
    assert parse_score("Score: 11", PATTERN, (0, 10)) is None  # outside the rubric's scale
    assert parse_score("Score: 3", PATTERN, (1, 5)) == 0.5


def test_parse_group_scores():
    text = "Response 1: 8\n2) 3\n#3 - score: 5\nResponse 9: 10"
    assert parse_group_scores(text, 4, (0, 10)) == [0.8, 0.3, 0.5, None]
    assert parse_group_scores("no idea", 2, (0, 10)) == [None, None]


def test_unparsable_verdicts_get_the_fallback_and_are_counted():
    asked = []

    def ask(questions):
        asked.extend(questions)
        return ["Score: 10", "hmm, hard to say", "Score: 5", "Score: 99"]

    fn = JudgeRewardFunction("judge", ask, fallback=-1.0)
    assert fn(["p1", "p2", "p3", "p4"], ["a", "b", "c", "d"]) == [1.0, -1.0, 0.5, -1.0]
    assert fn.last_metrics == {"unparsable": 0.5}
    assert "Request:\np2" in asked[1] and "Response:\nb" in asked[1]
    manager = RewardManager([__import__("rlft.rewards.specs", fromlist=["NamedReward"]).NamedReward("judge", fn)])
    assert manager.score(["p"] * 4, ["a"] * 4).extra == {"reward/judge/unparsable": 0.5}


def test_group_mode_asks_once_per_prompt_and_reads_one_score_per_completion():
    asked = []

    def ask(questions):
        asked.extend(questions)
        return ["1: 2\n2: 9\n3: 5", "Response 1: 10\nResponse 2: nonsense"]

    fn = JudgeRewardFunction("ruler", ask, mode="group")
    scores = fn(["q", "q", "q", "r", "r"], ["x", "y", "z", "u", "v"])
    assert scores == [0.2, 0.9, 0.5, 1.0, 0.0] and fn.last_metrics == {"unparsable": 0.2}
    assert len(asked) == 2 and "Response 3:\nz" in asked[0] and "3 responses" in asked[0]


def test_a_judge_needs_exactly_one_of_model_and_url():
    with pytest.raises(ValueError, match="exactly one of model"):
        JudgeReward(type="judge")
    with pytest.raises(ValueError, match="exactly one of model"):
        JudgeReward(type="judge", model="m", url="http://x")


class _ChatServer(BaseHTTPRequestHandler):
    answer = ""
    seen: list = []

    def do_POST(self):  # noqa: N802
        self.seen.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.answer.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    server.shutdown()


def test_endpoint_judge(chat_server):
    _ChatServer.answer = json.dumps({"choices": [{"message": {"content": "Score: 9"}}]})
    spec = JudgeReward(type="judge", url=chat_server, api_model="judge-7b")
    manager = RewardManager.from_specs([spec])
    assert manager.score(["p", "q"], ["a", "b"]).per_reward["judge"].tolist() == pytest.approx([0.9, 0.9])
    assert _ChatServer.seen[-1]["model"] == "judge-7b" and _ChatServer.seen[-1]["temperature"] == 0
    _ChatServer.answer = '{"error": "nope"}'
    with pytest.raises(RewardError, match="not a chat-completions answer"):
        manager.score(["p"], ["a"])


def test_local_judge_model_runs_and_its_babble_is_counted_as_unparsable(tiny_model_dir):
    spec = JudgeReward(type="judge", model=str(tiny_model_dir), max_new_tokens=4, fallback=0.25)
    fn = JudgeRewardFunction.from_spec("judge", spec)
    scores = fn(["What is 2+2?", "Name a colour."], ["4", "blue"])
    assert len(fn.last_judgements) == 2 and all(isinstance(j, str) for j in fn.last_judgements)
    unparsable = fn.last_metrics["unparsable"]
    assert scores.count(0.25) == round(unparsable * 2)  # a random tiny model rarely writes "Score: n"


@pytest.mark.parametrize("native", [True, False])
def test_a_local_judge_in_bf16_keeps_its_linears_in_bf16_where_bf16_is_native(native, tiny_model_dir, monkeypatch):
    """``dtype: bf16`` (``auto`` where bf16 pays): the judge's Linear weights in bf16, generating under autocast;
    where the CPU has no native bf16 it stays in fp32 and says so."""
    import logging

    import torch

    from rlft.models import precision

    if native and not precision.native_bf16(torch.device("cpu")):
        pytest.skip("this CPU has no native bf16")
    if not native:
        monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    loaded = []
    from rlft.models import loading

    original = loading.load_model_dir
    monkeypatch.setattr(loading, "load_model_dir", lambda *a, **k: loaded.append(original(*a, **k)) or loaded[-1])
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("rlft").addHandler(handler)
    try:
        spec = JudgeReward(type="judge", model=str(tiny_model_dir), max_new_tokens=3, dtype="bf16")
        fn = JudgeRewardFunction.from_spec("judge", spec)
        fn(["What is 2+2?"], ["4"])
    finally:
        logging.getLogger("rlft").removeHandler(handler)
    linears = {m.weight.dtype for m in loaded[0].modules() if isinstance(m, torch.nn.Linear)}
    assert len(fn.last_judgements) == 1 and isinstance(fn.last_judgements[0], str)
    assert loaded[0].get_input_embeddings().weight.dtype == torch.float32
    if native:
        assert torch.bfloat16 in linears and not any("no native bf16" in r.getMessage() for r in records)
    else:
        assert linears == {torch.float32}
        assert any("reward 'judge': its dtype is bf16 but this CPU has no native" in r.getMessage() for r in records)
