"""``type: http`` rewards: against the reference server (``rlft serve-reward``) and against servers
that time out, answer garbage or fail (retried when transient, then a clear error)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from rlft.config.rewards import HttpReward as HttpSpec
from rlft.errors import ConfigError, RewardError
from rlft.rewards.manager import RewardManager
from rlft.rewards.remote import HttpReward
from tests.cli.test_cli import _env
from tests.conftest import free_port

RULES = {
    "functions": [
        {"type": "numeric_answer", "name": "correct", "answer_field": "answer", "extract": "only"},
        {"type": "contains", "name": "polite", "keyword": "please", "weight": 0.5},
    ]
}
PROMPTS = [f"{i} + 1?" for i in range(8)]
COMPLETIONS = ["1", "2 please", "x", "4", "please 5", "6", "0", "8"]
ANSWERS = [str(i + 1) for i in range(8)]


@pytest.fixture(scope="module")
def reward_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward-server")
    (folder / "rewards.yaml").write_text(yaml.safe_dump({"reward": RULES}))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlft.cli.main",
            "serve-reward",
            "--reward-config",
            str(folder / "rewards.yaml"),
            "--port",
            str(port),
        ],
        env=_env(),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
        time.sleep(0.2)
    yield url + "/score"
    proc.terminate()
    proc.wait(timeout=30)


def _spec(url: str, **kw) -> HttpSpec:
    return HttpSpec(type="http", url=url, **kw)


def test_http_reward_matches_the_same_rewards_run_locally(reward_server):
    local = RewardManager.from_specs(_rules()).score(PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    remote = RewardManager.from_specs([_spec(reward_server, batch_size=3, name="served")])
    got = remote.score(PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert got.per_reward["served"].tolist() == local.total.tolist()
    assert local.total.tolist() == [1.0, 0.5, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0]  # "2 please" is no bare number
    fn = remote.rewards[0].fn
    assert fn.requests == 3  # 8 completions in batches of 3


def _rules():
    from rlft.config.rewards import RewardConfig

    return RewardConfig.model_validate(RULES).functions


def test_reference_server_reports_a_failing_reward_with_its_message(reward_server):
    r = httpx.post(reward_server, json={"prompts": ["a"], "completions": ["1"], "columns": {}})
    assert r.status_code == 422 and "needs column 'answer'" in r.json()["detail"]


class _Flaky(BaseHTTPRequestHandler):
    """Answers from a script of behaviours, one per request; the last repeats."""

    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append(body)
        action = self.script[min(len(self.seen) - 1, len(self.script) - 1)]
        if action == "sleep":
            time.sleep(1.0)
            action = "ok"
        status, payload, extra = {
            "ok": (200, json.dumps({"rewards": [len(c) for c in body["completions"]]}), {}),
            "500": (500, "boom", {}),
            "429": (429, "slow down", {"Retry-After": "0"}),
            "404": (404, "no such route", {}),
            "garbage": (200, "<html>not json</html>", {}),
            "short": (200, json.dumps({"rewards": [1.0]}), {}),
            "nan": (200, '{"rewards": [NaN, 1.0]}', {}),
            "text": (200, json.dumps({"rewards": ["high", 1.0]}), {}),
        }[action]
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def use(*script):
        _Flaky.script, _Flaky.seen = list(script), []
        return f"http://127.0.0.1:{server.server_address[1]}/score"

    yield use
    server.shutdown()


def _reward(url, **kw) -> HttpReward:
    return HttpReward("remote", url, backoff=0.01, **{"retries": 3, **kw})


def test_transient_failures_are_retried_then_succeed(flaky):
    fn = _reward(flaky("500", "429", "ok"))
    assert fn(["p", "q"], ["ab", "abc"], answer=["x", "y"]) == [2.0, 3.0]
    assert fn.requests == 3 and _Flaky.seen[-1]["columns"] == {"answer": ["x", "y"]}


def test_the_episodes_environment_instances_are_not_sent(flaky):
    """``environments`` holds objects of the trainer's process (TRL's environments=), not data: a
    scoring service gets the data columns only."""
    fn = _reward(flaky("ok"))
    assert fn(["p", "q"], ["a", "bb"], answer=["1", "2"], environments=[object(), object()]) == [1.0, 2.0]
    assert _Flaky.seen[0]["columns"] == {"answer": ["1", "2"]}


def test_persistent_5xx_and_timeouts_end_in_a_clear_error(flaky):
    fn = _reward(flaky("500"), retries=2)
    with pytest.raises(
        RewardError,
        match=r"reward 'remote' \(http://127\.0\.0\.1:\d+/score, completions 0\.\.1\): "
        r"the server answered 500 after 3 attempts",
    ):
        fn(["p", "q"], ["a", "b"])
    slow = _reward(flaky("sleep"), retries=1, timeout=0.2)
    with pytest.raises(RewardError, match="ReadTimeout after 2 attempts"):
        slow(["p"], ["a"])
    assert slow.requests == 2


@pytest.mark.parametrize(
    "answer, message",
    [
        ("garbage", "not JSON"),
        ("short", "1 scores for 2 completions"),
        ("nan", "score 0 is nan, not a finite number"),
        ("text", "score 0 is 'high', not a number"),
        ("404", "answered 404: "),
    ],
)
def test_wrong_answers_are_errors_at_once_without_retries(flaky, answer, message):
    fn = _reward(flaky(answer))
    with pytest.raises(RewardError, match=message):
        fn(["p", "q"], ["a", "b"])
    assert fn.requests == 1


def test_a_manager_passes_the_http_error_through_without_rescoring_each_sample(flaky):
    manager = RewardManager.from_specs([_spec(flaky("garbage"), name="judge", retries=0)])
    with pytest.raises(RewardError, match="reward 'judge'.*not JSON"):
        manager.score(["p"] * 4, ["a"] * 4)
    assert len(_Flaky.seen) == 1


def test_the_url_must_be_http():
    from rlft.config.loader import load_config

    cfg = {
        "model": {"path": "smollm2-135m-instruct"},
        "data": {"train_file": "x.jsonl"},
        "reward": {"functions": [{"type": "http", "url": "file:///etc/passwd"}]},
    }
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.url"):
        load_config(data=cfg, check_files=False)


def test_grpo_trains_on_a_served_reward(reward_server, tiny_config):
    """The RL loop end to end with its reward served over HTTP."""
    from rlft import Trainer
    from tests.conftest import write_jsonl

    write_jsonl(Path(tiny_config["data"]["train_file"]), [{"prompt": p, "answer": "1"} for p in PROMPTS])
    tiny_config["reward"] = {"functions": [{"type": "http", "url": reward_server, "name": "served"}]}
    tiny_config["train"].update(max_steps=2)
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "reward/served/mean" in rows[0]
