"""The OpenEnv-style HTTP adapter against a small server the test starts."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlft.envs.spec import EnvironmentSession, EnvironmentSpec


class _Counter(BaseHTTPRequestHandler):
    """Episodes keyed by episode_id: the target is seed % 10; action {"guess": n}; reward 1 when hit."""

    episodes: dict[str, int] = {}

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/reset":
            self.episodes[body["episode_id"]] = body["seed"] % 10
            out = {"observation": {"message": "guess a digit"}, "reward": None, "done": False}
        elif self.path == "/step":
            target = self.episodes.get(body["episode_id"])
            if target is None:
                self.send_error(404, "unknown episode")
                return
            guess = body["action"].get("guess")
            hit = guess == target
            out = {
                "observation": {"message": "yes" if hit else ("higher" if guess < target else "lower")},
                "reward": 1.0 if hit else 0.0,
                "done": hit,
            }
        else:
            self.send_error(404)
            return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_adapter_plays_an_episode_against_the_server(server):
    spec = EnvironmentSpec.load("openenv", [], {"url": server})
    assert spec.tool_names == ["step"] and spec.has_reward
    session = EnvironmentSession(spec)
    assert session.reset({"prompt": "p"}, seed=7) == "guess a digit"
    target = _Counter.episodes[session.env.episode_id]  # this episode's, whatever other tests left on the server
    lo, hi, seen = 0, 9, []
    while not session.done:
        mid = (lo + hi) // 2
        reply = session.call("step", {"action": {"guess": mid}})
        seen.append(reply)
        if reply == "higher":
            lo = mid + 1
        elif reply == "lower":
            hi = mid - 1
    assert seen[-1] == "yes" and session.reward() == 1.0 and mid == target
    assert "yes" not in seen[:-1] and len(seen) <= 4  # found by following the server's feedback


def test_same_seed_same_task_and_server_errors_raise(server):
    spec = EnvironmentSpec.load("openenv", [], {"url": server})
    a, b = EnvironmentSession(spec), EnvironmentSession(spec)
    a.reset({}, seed=3)
    b.reset({}, seed=3)
    assert _Counter.episodes[a.env.episode_id] == _Counter.episodes[b.env.episode_id]
    a.env.episode_id = "nope"
    with pytest.raises(RuntimeError, match="answered 404"):
        a.call("step", {"action": {"guess": 1}})


def test_unreachable_server_fails_reset_with_its_address():
    from rlft.envs.worker import ProcessWorker

    worker = ProcessWorker(EnvironmentSpec.load("openenv", [], {"url": "http://127.0.0.1:9", "timeout": 2}))
    worker.send("reset", {}, 0)
    reply = worker.receive(10)
    worker.kill()
    assert not reply.ok and "ConnectError" in reply.value
