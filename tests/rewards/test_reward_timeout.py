"""A custom reward's ``timeout``: a slow or hung function stops the run with a RewardError naming it."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import threading
import time

import pytest
from pydantic import TypeAdapter, ValidationError

from rlft.config.schema import RewardSpec
from rlft.errors import RewardError
from rlft.rewards.manager import RewardManager
from rlft.rewards.timed import RewardTimeout, call_with_timeout
from tests import forked

SPEC = TypeAdapter(RewardSpec)

SLOW = """
import threading, time

CALLS = {"thread": None}

def hangs(completions, **kw):
    time.sleep(3600)
    return [1.0] * len(completions)

def naps(completions, nap=0.0, **kw):
    time.sleep(nap)
    return [1.0] * len(completions)

def where(completions, **kw):
    CALLS["thread"] = threading.current_thread().name
    return [0.5] * len(completions)

def picky(completions, **kw):
    if len(completions) > 1:
        raise RuntimeError("batch too big")
    time.sleep(3600)

def needs_main_thread(completions, **kw):
    import signal
    signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
    return [1.0] * len(completions)
"""


def manager(tmp_path, function, **spec):
    path = tmp_path / "slow_rewards.py"
    path.write_text(SLOW, encoding="utf-8")
    return RewardManager.from_specs(
        [SPEC.validate_python({"type": "custom", "function": f"{path}:{function}", **spec})]
    )


def test_the_default_timeout_and_null_and_bad_values():
    spec = SPEC.validate_python({"type": "custom", "function": "m:f"})
    assert spec.timeout == 300.0
    assert SPEC.validate_python({"type": "custom", "function": "m:f", "timeout": None}).timeout is None
    for bad in (0, -1):
        with pytest.raises(ValidationError, match="timeout"):
            SPEC.validate_python({"type": "custom", "function": "m:f", "timeout": bad})


def test_a_hung_reward_fails_within_its_timeout_naming_the_function(tmp_path):
    m = manager(tmp_path, "hangs", timeout=0.5)
    start = time.perf_counter()
    with pytest.raises(RewardError) as exc:
        m.score(["p"] * 4, ["a", "b", "c", "d"], {})
    assert time.perf_counter() - start < 30  # a hang would never return; 30 s leaves a loaded machine room
    msg = str(exc.value)
    assert msg.startswith("reward 'hangs' exceeded its timeout of 0.5 s on a batch of 4 completions"), msg
    assert "'timeout' in reward.functions" in msg and "first completion of the batch: 'a'" in msg, msg


def test_the_timeout_is_not_re_run_sample_by_sample_but_a_failure_is(tmp_path):
    # the batch raises, so each sample is scored alone to find the culprit; one alone hangs: its timeout says so
    m = manager(tmp_path, "picky", timeout=0.3)
    start = time.perf_counter()
    with pytest.raises(
        RewardError,
        match=r"reward 'picky' raised RuntimeError: batch too big .*\(on the batch of 3\); "
        r"scored alone, sample 0 exceeded its timeout of 0.3 s",
    ):
        m.score(["p"] * 3, ["a", "b", "c"], {})
    assert time.perf_counter() - start < 30  # a hang would never return; 30 s leaves a loaded machine room


def test_a_slow_call_is_warned_about_once(tmp_path, caplog):
    m = manager(tmp_path, "naps", timeout=0.4, kwargs={"nap": 0.25})
    with caplog.at_level(logging.WARNING, logger="rlft"):
        for _ in range(2):
            assert m.score(["p"], ["a"], {}).total.tolist() == [1.0]
    slow = [r.getMessage() for r in caplog.records if "over half its timeout" in r.getMessage()]
    assert len(slow) == 1, slow
    assert slow[0].startswith("reward 'naps' took 0.") and "timeout of 0.4 s" in slow[0]


def test_a_quick_call_is_not_warned_about_and_runs_on_a_worker_thread(tmp_path, caplog):
    m = manager(tmp_path, "where")
    with caplog.at_level(logging.WARNING, logger="rlft"):
        assert m.score(["p"], ["a"], {}).total.tolist() == [0.5]
    assert not caplog.records
    module = m.rewards[0].fn.__globals__
    assert module["CALLS"]["thread"] == "rlft-reward-where"
    inline = manager(tmp_path, "where", timeout=None)
    inline.score(["p"], ["a"], {})
    assert inline.rewards[0].fn.__globals__["CALLS"]["thread"] == threading.current_thread().name


def test_signal_handlers_on_the_worker_thread_get_a_hint_and_timeout_null_runs_them(tmp_path):
    with pytest.raises(RewardError, match=r"only works in main thread.*give it 'timeout: null'"):
        manager(tmp_path, "needs_main_thread").score(["p"], ["a"], {})
    assert manager(tmp_path, "needs_main_thread", timeout=None).score(["p"], ["a"], {}).total.tolist() == [1.0]


def test_the_worker_runs_in_the_callers_grad_and_inference_mode():
    import torch

    def modes():
        return torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    assert call_with_timeout(modes, {}, 5.0) == (True, False)
    with torch.no_grad():
        assert call_with_timeout(modes, {}, 5.0) == (False, False)
    with torch.inference_mode():
        assert call_with_timeout(modes, {}, 5.0) == (False, True)


def test_call_with_timeout_passes_results_and_errors_through():
    assert call_with_timeout(lambda x: x + 1, {"x": 1}, 5.0) == 2
    with pytest.raises(KeyError, match="nope"):
        call_with_timeout(lambda: {}["nope"], {}, 5.0)
    with pytest.raises(RewardTimeout, match="exceeded its timeout of 0.1 s"):
        call_with_timeout(lambda: time.sleep(10), {}, 0.1)


HUNG_RUN = """
import json, sys, time
from pydantic import TypeAdapter
from rlft.config.schema import RewardSpec
from rlft.errors import RewardError
from rlft.rewards.manager import RewardManager

spec = TypeAdapter(RewardSpec).validate_python({{"type": "custom", "function": {function!r}, "timeout": 1}})
start = time.perf_counter()
try:
    RewardManager.from_specs([spec]).score(["p"], ["a"], {{}})
except RewardError as exc:
    print(json.dumps({{"error": str(exc), "seconds": time.perf_counter() - start}}))
    sys.exit(1)
"""


def test_the_process_exits_though_the_hung_call_never_returns(tmp_path):
    """The abandoned worker is a daemon thread: the interpreter exits without waiting for its sleep(3600)."""
    (tmp_path / "slow_rewards.py").write_text(SLOW, encoding="utf-8")
    script = textwrap.dedent(HUNG_RUN.format(function=f"{tmp_path / 'slow_rewards.py'}:hangs"))
    start = time.perf_counter()
    proc = forked.run([sys.executable, "-c", script], timeout=120)
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert "reward 'hangs' exceeded its timeout of 1 s" in out["error"]
    assert 1.0 <= out["seconds"] < 30  # the 1 s timeout, plus what a loaded machine adds
    # the whole process (start-up and imports included) ends long before the hung call would
    assert time.perf_counter() - start < 100


def test_a_training_run_with_a_hung_reward_fails_as_a_reward_error(tmp_path, tiny_config):
    from tests.cli.test_cli import assert_user_error, quick, run_cli, write_config

    (tmp_path / "slow_rewards.py").write_text(SLOW, encoding="utf-8")
    cfg = quick(tiny_config)
    cfg["reward"]["functions"] = [{"type": "custom", "function": "slow_rewards.py:hangs", "timeout": 1}]
    proc = run_cli(["train", "--config", str(write_config(tmp_path, cfg))], tmp_path, timeout=170)
    stderr = assert_user_error(proc, code=None)
    assert "reward 'hangs' exceeded its timeout of 1 s on a batch of 4 completions" in stderr, stderr
    info = json.loads((tmp_path / "outputs" / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error_type"] == "reward", info
