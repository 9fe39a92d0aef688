"""Tests for custom reward loading and the RewardManager."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
import torch
from pydantic import TypeAdapter

from rlft.config.schema import RewardSpec
from rlft.errors import RewardError
from rlft.plugins import load_custom_reward
from rlft.rewards.manager import RewardManager

SPEC = TypeAdapter(RewardSpec)


def specs(*dicts):
    return [SPEC.validate_python(d) for d in dicts]


def write_module(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


# ---------------------------------------------------------------- loading


def test_custom_reward_from_file(tmp_path):
    p = write_module(tmp_path, "my_rewards.py", "def r(completions, **kw):\n    return [1.0 for _ in completions]\n")
    fn = load_custom_reward(f"{p}:r")
    assert fn(completions=["a", "b"]) == [1.0, 1.0]
    assert fn.__module__.startswith("rlft_user_my_rewards_")


def test_custom_reward_file_imports_its_neighbour(tmp_path):
    write_module(tmp_path, "helper_mod_xyz.py", "VALUE = 3.0\n")
    p = write_module(
        tmp_path,
        "uses_helper.py",
        "from helper_mod_xyz import VALUE\ndef r(completions, **kw):\n    return [VALUE] * len(completions)\n",
    )
    assert load_custom_reward(f"{p}:r")(completions=["a"]) == [3.0]


def test_custom_reward_from_module(tmp_path, monkeypatch):
    write_module(
        tmp_path,
        "rlft_test_reward_mod.py",
        "def score(prompts, completions, **kw):\n    return [2.0] * len(completions)\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlft_test_reward_mod", raising=False)
    fn = load_custom_reward("rlft_test_reward_mod:score")
    assert fn(prompts=["p"], completions=["c"]) == [2.0]


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("no_colon", "expected 'package.module:function'"),
        ("rlft_no_such_module_q:fn", "module 'rlft_no_such_module_q' not found"),
        ("missing/file.py:fn", "file not found: missing/file.py"),
        ("math:no_such_fn", "math has no attribute 'no_such_fn'"),
        ("math:pi", "'pi' is a float, not a function"),
    ],
)
def test_custom_reward_errors_name_the_spec(spec, problem):
    with pytest.raises(RewardError) as exc:
        load_custom_reward(spec)
    assert f"custom reward '{spec}'" in str(exc.value)
    assert problem in str(exc.value)


def test_custom_reward_file_that_raises(tmp_path):
    p = write_module(tmp_path, "boom.py", "raise RuntimeError('kaput')\n")
    with pytest.raises(RewardError, match="raised RuntimeError: kaput"):
        load_custom_reward(f"{p}:r")
    s = write_module(tmp_path, "syntax.py", "def r(:\n")
    with pytest.raises(RewardError, match=r"SyntaxError \(line 1\)"):
        load_custom_reward(f"{s}:r")


def test_missing_attribute_lists_defined_functions(tmp_path):
    p = write_module(tmp_path, "few.py", "def alpha(completions, **kw): ...\ndef beta(completions, **kw): ...\n")
    with pytest.raises(RewardError, match=r"functions defined there: alpha, beta"):
        load_custom_reward(f"{p}:gamma")


# ---------------------------------------------------------------- manager


def test_trl_style_function_works_unchanged(tmp_path):
    p = write_module(
        tmp_path, "trl_style.py", "def r(completions, **kwargs):\n    return [len(c) for c in completions]\n"
    )
    m = RewardManager.from_specs(specs({"type": "custom", "function": f"{p}:r"}))
    res = m.score(["p1", "p2"], ["abc", "de"], {"answer": [1, 2]})
    assert m.names == ["r"]
    assert res.per_reward["r"].tolist() == [3.0, 2.0]
    assert res.total.dtype == torch.float32


def test_columns_and_kwargs_passed(tmp_path):
    p = write_module(
        tmp_path,
        "cols.py",
        """
        def r(prompts, completions, answer, bonus=0.0, **kwargs):
            assert kwargs["other"] == ["o1", "o2"]
            return [float(c == str(a)) + bonus for c, a in zip(completions, answer)]
        """,
    )
    m = RewardManager.from_specs(specs({"type": "custom", "function": f"{p}:r", "kwargs": {"bonus": 0.5}}))
    res = m.score(["p", "p"], ["1", "x"], {"answer": [1, 2], "other": ["o1", "o2"]})
    assert res.per_reward["r"].tolist() == [1.5, 0.5]


def test_weighted_total_and_names():
    m = RewardManager.from_specs(
        specs(
            {"type": "numeric_answer", "weight": 2.0},
            {"type": "contains", "keyword": "because", "weight": 0.5, "name": "explains"},
            {"type": "length_penalty", "target_chars": 5, "penalty_per_char": 0.1, "max_penalty": 1.0},
        )
    )
    assert m.names == ["numeric_answer", "explains", "length_penalty"]
    assert m.weights == {"numeric_answer": 2.0, "explains": 0.5, "length_penalty": 1.0}
    comps = ["7", "because 7", "8"]
    res = m.score(["q"] * 3, comps, {"answer": [7, 7, 7]})
    assert res.names == m.names
    assert res.per_reward["numeric_answer"].tolist() == [1.0, 1.0, 0.0]
    assert res.per_reward["explains"].tolist() == [0.0, 1.0, 0.0]
    assert res.per_reward["length_penalty"].tolist() == pytest.approx([0.0, -0.4, 0.0])
    assert res.total.tolist() == pytest.approx([2.0, 2.0 + 0.5 - 0.4, 0.0])
    assert res.total.shape == (3,) and res.total.dtype == torch.float32


def test_missing_answer_column_names_reward_and_columns():
    m = RewardManager.from_specs(specs({"type": "exact_answer", "answer_field": "gold"}))
    with pytest.raises(RewardError) as exc:
        m.score(["p"], ["c"], {"answer": ["c"], "id": [1]})
    msg = str(exc.value)
    assert "reward 'exact_answer'" in msg and "'gold'" in msg and "answer, id" in msg


def crash_module(tmp_path):
    return write_module(
        tmp_path,
        "crashy.py",
        """
        def myfn(completions, **kw):
            out = []
            for c in completions:
                if c == "bad":
                    raise ValueError("cannot score this")
                out.append(1.0)
            return out

        def batch_only(completions, **kw):
            if len(completions) > 1:
                raise RuntimeError("batch too big")
            return [1.0]
        """,
    )


def test_crashing_reward_names_reward_and_sample(tmp_path):
    p = crash_module(tmp_path)
    m = RewardManager.from_specs(specs({"type": "custom", "function": f"{p}:myfn"}))
    comps = ["ok"] * 16
    comps[5] = "bad"
    with pytest.raises(RewardError) as exc:
        m.score([""] * 16, comps, {})
    msg = str(exc.value)
    assert msg.startswith("reward 'myfn' raised ValueError on sample 5 of 16: cannot score this")
    assert "crashy.py" in msg and "'bad'" in msg


def test_batch_only_failure_reported_without_index(tmp_path):
    p = crash_module(tmp_path)
    m = RewardManager.from_specs(specs({"type": "custom", "function": f"{p}:batch_only"}))
    with pytest.raises(
        RewardError, match=r"reward 'batch_only' raised RuntimeError: batch too big.*every sample passed"
    ):
        m.score(["", ""], ["a", "b"], {})


@pytest.mark.parametrize(
    "body, problem",
    [
        ("return [1.0, float('nan'), 1.0, 1.0]", r"returned a non-finite value \(nan\) for sample 1 of 4"),
        ("return [1.0, 1.0, 1.0, float('inf')]", r"returned a non-finite value \(inf\) for sample 3 of 4"),
        ("return [1.0, float('-inf'), None, 1.0]", r"returned a non-finite value \(-inf\) for sample 1 of 4"),
        ("return [1.0, '1', 1.0, 1.0]", r"returned a non-numeric value \('1'\) for sample 1 of 4"),
        ("return [1.0, [1], 1.0, 1.0]", r"returned a non-numeric value \(list\) for sample 1 of 4"),
        ("return [1.0] * 3", r"returned 3 values; expected 4"),
        ("return 1.0", r"returned float; expected a list of 4 floats"),
    ],
)
def test_bad_return_values(tmp_path, body, problem):
    p = write_module(tmp_path, "badret.py", f"def x(completions, **kw):\n    {body}\n")
    m = RewardManager.from_specs(specs({"type": "custom", "function": f"{p}:x"}))
    with pytest.raises(RewardError, match=f"reward 'x' {problem}"):
        m.score([""] * 4, ["a"] * 4, {})


def test_bools_tuples_and_tensors_accepted(tmp_path):
    p = write_module(
        tmp_path,
        "ok.py",
        "import torch\ndef b(completions, **kw):\n    return [True, False]\n"
        "def t(completions, **kw):\n    return (1, 2)\n"
        "def z(completions, **kw):\n    return torch.tensor([0.5, 0.25])\n",
    )
    m = RewardManager.from_specs(specs(*({"type": "custom", "function": f"{p}:{n}"} for n in "btz")))
    res = m.score(["", ""], ["a", "b"], {})
    assert res.total.tolist() == [2.5, 2.25]


def test_spec_errors():
    with pytest.raises(RewardError, match="invalid regular expression"):
        RewardManager.from_specs(specs({"type": "regex", "pattern": "("}))
    with pytest.raises(RewardError, match="needs 'pattern' or 'required_tags'"):
        RewardManager.from_specs(specs({"type": "format"}))
    with pytest.raises(RewardError, match="duplicate reward names"):
        RewardManager.from_specs(specs({"type": "contains", "keyword": "a"}, {"type": "contains", "keyword": "b"}))
    with pytest.raises(RewardError, match="no reward functions"):
        RewardManager.from_specs([])


def test_misaligned_batch():
    m = RewardManager.from_specs(specs({"type": "contains", "keyword": "a"}))
    with pytest.raises(RewardError, match="2 prompts but 1 completions"):
        m.score(["a", "b"], ["a"], {})
    with pytest.raises(RewardError, match="column 'answer' has 1 values"):
        m.score(["a", "b"], ["a", "b"], {"answer": [1]})


def test_empty_batch():
    m = RewardManager.from_specs(specs({"type": "contains", "keyword": "a"}))
    res = m.score([], [], {})
    assert res.total.shape == (0,)
    assert not math.isnan(res.total.sum().item())
