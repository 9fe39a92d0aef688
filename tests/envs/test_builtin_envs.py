"""The built-in environments: tools behave, data splits hold, demonstrations are correct."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlft.envs.builtin import BUILTIN_ENVIRONMENTS, builtin_module, calculator, guess, python, search, search_corpus
from rlft.envs.tools import environment_methods, tool_schema
from rlft.errors import EnvironmentFailure

DATA = Path(__file__).resolve().parents[2] / "data"
MODULES = {"calculator": calculator, "search": search, "guess_number": guess, "python": python}


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("search") / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in search.make_corpus(0)))
    return str(path)


# ---------------------------------------------------------------- registry and schemas


def test_registry_names_modules_and_classes():
    from rlft.config.environment import BUILTIN_ENVIRONMENT_NAMES
    from rlft.plugins import load_object

    assert set(BUILTIN_ENVIRONMENTS) == {"calculator", "search", "guess_number", "python", "openenv", "verifiers"}
    assert set(BUILTIN_ENVIRONMENTS) == set(BUILTIN_ENVIRONMENT_NAMES)
    for name, entry in BUILTIN_ENVIRONMENTS.items():
        if name in ("openenv", "verifiers"):  # adapters: their tasks live elsewhere (no rows, no demonstrations)
            continue
        module = builtin_module(name)
        assert module is MODULES[name]
        assert load_object(entry.env_class, "environment class") is getattr(module, entry.env_class.split(":")[1])
        assert all(callable(getattr(module, f)) for f in ("make_rows", "demo_rows", "demonstration"))
    with pytest.raises(EnvironmentFailure, match="calculator"):
        builtin_module("nope")


def test_registry_import_is_light():
    code = (
        "import sys, rlft.envs.builtin; "
        "print(sorted(m for m in ('bm25s', 'transformers', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "cls, tools",
    [(calculator.CalculatorEnv, ["calculate"]), (search.SearchEnv, ["search"]), (guess.GuessNumberEnv, ["guess"])],
)
def test_every_tool_has_a_schema(cls, tools):
    methods = environment_methods(cls)
    assert sorted(methods) == tools
    for name, fn in methods.items():
        schema = tool_schema(fn, cls.__name__)["function"]
        assert schema["name"] == name and schema["description"]
        assert set(schema["parameters"]["required"]) == set(schema["parameters"]["properties"])
        assert all(p.get("description") for p in schema["parameters"]["properties"].values())


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("47 * 86", "4042"),
        ("123 + 456", "579"),
        ("(2 + 3) * 4", "20"),
        ("-5 + 2", "-3"),
        ("-(3 - 10)", "7"),
        ("84 / 2", "42"),
        ("7 / 2", "3.5"),
        ("10 / 3", "3.333333333"),
        ("1.5 * 2", "3"),
        ("47 × 86", "4042"),
        (" 12*12 ", "144"),
        ("99 - 100", "-1"),
    ],
)
def test_calculate_arithmetic(expression, expected):
    assert calculator.CalculatorEnv().calculate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('echo hi')",
        "().__class__",
        "open('/etc/passwd')",
        "2 ** 10",
        "lambda: 1",
        "[1, 2]",
        "1 if 1 else 0",
        "x + 1",
        "True + 1",
        "1 < 2",
        "'a' * 3",
        "5 // 2",
        "5 % 2",
        "1j",
        "+5",
        "",
        "47 *",
        "1 / 0",
        "1e309",
        "1e300 * 1e300",
        "1" * 201,
        None,
        42,
    ],
)
def test_calculate_refuses_with_an_error_string(expression):
    out = calculator.CalculatorEnv().calculate(expression)
    assert isinstance(out, str) and out.startswith("error: ")


def test_calculator_rows_are_right_and_split():
    train, evalrows = calculator.make_rows("train", 400, 0), calculator.make_rows("eval", 60, 0)
    ops = {"*": lambda a, b: a * b, "+": lambda a, b: a + b}
    for row in train + evalrows:
        a, op, b = row["expression"].split()
        assert row["answer"] == str(ops[op](int(a), int(b)))
        assert a in row["prompt"] and b in row["prompt"]
        assert row["prompt"] == calculator.PHRASINGS["mul" if op == "*" else "add"][row["phrasing"]].format(a=a, b=b)
        if op == "*":
            assert 11 <= int(a) <= 99 and 11 <= int(b) <= 99
        else:
            assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999

    def pairs(rows):
        return {(r["expression"].split()[1], *sorted(map(int, r["expression"].split()[::2]))) for r in rows}

    assert len(pairs(train)) == 400 and len(pairs(evalrows)) == 60  # no repeats within a split
    other_seed = calculator.make_rows("eval", 60, 7) + calculator.make_rows("eval", 60, 0)
    assert not pairs(train) & pairs(other_seed)
    assert not pairs(calculator.demo_rows(200, 3)) & pairs(other_seed)


def test_calculator_phrasings():
    demo = set(calculator.DEMO_PHRASING.values())
    for op, phrasings in calculator.PHRASINGS.items():
        assert len(set(phrasings) - demo) >= 6 and calculator.DEMO_PHRASING[op] in phrasings
    train, evalrows = calculator.make_rows("train", 400, 0), calculator.make_rows("eval", 60, 0)
    assert not {r["phrasing"] for r in evalrows} & demo
    assert {r["phrasing"] for r in evalrows} == {p for ps in calculator.PHRASINGS.values() for p in ps} - demo
    assert {r["phrasing"] for r in train} == {p for ps in calculator.PHRASINGS.values() for p in ps}
    assert {r["phrasing"] for r in calculator.demo_rows(20, 0)} == demo
    assert calculator.demo_rows(2, 0)[0]["prompt"].startswith("What is ")


def test_calculator_demonstration():
    for row in calculator.demo_rows(10, 0):
        demo = calculator.demonstration(row)
        user, call, tool, final = demo["messages"]
        assert user == {"role": "user", "content": row["prompt"]}
        assert call["tool_calls"][0]["function"] == {
            "name": "calculate",
            "arguments": {"expression": row["expression"]},
        }
        assert tool == {"role": "tool", "name": "calculate", "content": row["answer"]}
        assert final == {"role": "assistant", "content": f"The answer is {row['answer']}."}
        assert [t["function"]["name"] for t in demo["tools"]] == ["calculate"]


# ---------------------------------------------------------------- search


def test_corpus_is_invented_and_unique():
    corpus = search.make_corpus(0)
    assert 60 <= len(corpus) <= 80
    assert len({d["id"] for d in corpus}) == len({d["title"] for d in corpus}) == len(corpus)
    assert all(set(d) == {"id", "title", "text"} and len(d["text"].split()) < 45 for d in corpus)
    assert search.make_corpus(0) == corpus and search.make_corpus(1) != corpus


def test_search_top_hit_is_the_right_document_for_every_question(docs):
    env = search.SearchEnv(docs)
    train, evalrows = search.make_rows("train", 720, 0), search.make_rows("eval", 108, 0)  # every question
    by_id = {d["id"]: d for d in search.make_corpus(0)}
    assert len({(r["doc_id"], r["answer"]) for r in train + evalrows}) == 3 * len(by_id)  # every fact asked
    for row in train + evalrows + _read(DATA / "search_train.jsonl") + _read(DATA / "search_eval.jsonl"):
        doc = by_id[row["doc_id"]]
        assert row["query"].startswith(row["entity"]) and len(row["query"].split()) == len(row["entity"].split()) + 1
        top = env.search(row["query"]).splitlines()[0]
        assert top == f"[{doc['title']}] {doc['text']}", row
        assert row["answer"] in doc["text"] and len(row["answer"].split()) == 1


def test_search_output_and_errors(docs):
    env = search.SearchEnv(docs)
    out = env.search("town founded region").splitlines()
    assert len(out) == 2 and all(line.startswith("[") for line in out)
    assert env.search("the of and") == "No documents match that query."
    assert env.search("zzzqqq") == "No documents match that query."
    for bad in ("", "   ", "x " * 150, None):
        assert env.search(bad).startswith("error: ")
    with pytest.raises(EnvironmentFailure, match="cannot be read"):
        search.SearchEnv(str(Path(docs).parent / "missing.jsonl"))


def test_search_index_is_cached_per_path_and_mtime(docs, tmp_path):
    assert search.SearchEnv(docs).retriever is search.SearchEnv(docs).retriever
    copy = tmp_path / "docs.jsonl"
    copy.write_text(Path(docs).read_text())
    first = search.SearchEnv(str(copy))
    assert first.retriever is not search.SearchEnv(docs).retriever
    copy.write_text(
        json.dumps({"id": "x", "title": "Zintarra", "text": "Zintarra was founded in 1700."})
        + "\n"
        + json.dumps({"id": "y", "title": "Oddly", "text": "Oddly is a place."})
        + "\n"
    )
    os.utime(copy, ns=(os.stat(copy).st_atime_ns, os.stat(copy).st_mtime_ns + 10**9))
    changed = search.SearchEnv(str(copy))
    assert changed.retriever is not first.retriever
    assert changed.search("Zintarra founded").startswith("[Zintarra] Zintarra was founded in 1700.")


def test_search_splits_and_phrasings():
    demo = set(search_corpus.DEMO_PHRASING.values())
    train, evalrows = search.make_rows("train", 300, 0), search.make_rows("eval", 50, 5)
    assert not {r["doc_id"] for r in train} & {r["doc_id"] for r in evalrows}
    assert not {r["doc_id"] for r in search.demo_rows(180, 1)} & {r["doc_id"] for r in search.make_rows("eval", 108, 0)}
    assert not {r["phrasing"] for r in search.make_rows("eval", 108, 0)} & demo
    assert demo <= {r["phrasing"] for r in train}
    assert {r["phrasing"] for r in search.demo_rows(30, 0)} == demo
    assert all(len(set(ps) - demo) >= 3 for ps in search_corpus.PHRASINGS.values())
    assert len({json.dumps(r, sort_keys=True) for r in train}) == 300
    with pytest.raises(ValueError, match="distinct"):
        search.make_rows("eval", 109, 0)


def test_search_demonstration(docs):
    env = search.SearchEnv(docs)
    for row in search.demo_rows(12, 0):
        demo = search.demonstration(row, docs=docs)
        user, call, tool, final = demo["messages"]
        assert user["content"] == row["prompt"]
        assert call["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": row["query"]}}
        assert tool == {"role": "tool", "name": "search", "content": env.search(row["query"])}
        assert row["answer"] in tool["content"].splitlines()[0]
        assert final == {"role": "assistant", "content": f"The answer is {row['answer']}."}


# ---------------------------------------------------------------- guess the number


def test_guess_feedback_done_and_reward():
    env = guess.GuessNumberEnv()
    assert env.reset(secret=17, prompt="p") is None
    assert (env.guess(10), env.guess(20), env.done, env.get_reward()) == ("Too low.", "Too high.", False, 0.0)
    for bad in (0, 31, -4, "ten", 2.5, True, None):
        assert env.guess(bad).startswith("error: ")
    assert env.guesses == 2
    assert env.guess(17) == "Correct!" and env.done and env.get_reward() == 1.0 and env.guesses == 3
    assert env.guess(17).startswith("error: ")
    assert env.reset(secret=3) is None and not env.done and env.get_reward() == 0.0 and env.guesses == 0
    assert env.guess("3") == "Correct!"
    for secret in (0, 31, "5", None):
        with pytest.raises(ValueError):
            env.reset(secret=secret)


def test_guess_progress_reward_pays_information_and_not_ruled_out_guesses():
    env = guess.GuessNumberEnv(progress_weight=0.5)
    env.reset(secret=17)
    assert env.get_reward() == 0.0
    assert env.guess(15) == "Too low."  # 15 of 30 left: one bit of log2(30) ~ 4.91
    assert env.get_reward() == pytest.approx(0.5 * math.log(2) / math.log(30))
    after_one = env.get_reward()
    assert env.guess(3) == "Too low." and env.guess(29) == "Too high."  # 3 was ruled out already: no credit
    assert env.get_reward() == pytest.approx(0.5 * math.log(30 / 13) / math.log(30)) and env.get_reward() > after_one
    assert env.guess(16) == "Too low." and env.guess(18) == "Too high."  # only 17 is left: all the information
    assert env.get_reward() == pytest.approx(0.5)
    assert env.guess(17) == "Correct!" and env.get_reward() == 1.0
    env.reset(secret=17)  # a reset forgets what the last episode learned
    assert env.get_reward() == 0.0 and env.possible == (1, 30)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="progress_weight"):
            guess.GuessNumberEnv(progress_weight=bad)


@pytest.mark.parametrize("low, high, most", [(1, 30, 5), (1, 100, 7), (5, 9, 3)])
def test_guess_demonstration_is_binary_search(low, high, most):
    for secret in range(low, high + 1):
        row = {"prompt": "find it", "secret": secret, "phrasing": "guess_direct"}
        messages = guess.demonstration(row, low=low, high=high)["messages"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert results[-1] == "Correct!" and all(r in ("Too low.", "Too high.") for r in results[:-1])
        assert len(results) <= most
        assert messages[-2]["role"] == "tool" and messages[-1] == {
            "role": "assistant",
            "content": f"The number is {secret}.",
        }
        assert messages[-3]["tool_calls"][0]["function"]["arguments"] == {"number": secret}


def test_guess_rows():
    demo = set(guess.DEMO_PHRASING.values())
    train, evalrows = guess.make_rows("train", 300, 0), guess.make_rows("eval", 50, 0)
    assert all(1 <= r["secret"] <= 30 and "1" in r["prompt"] and "30" in r["prompt"] for r in train + evalrows)
    assert all("too low" in r["prompt"].lower() for r in train + evalrows)
    assert not {r["phrasing"] for r in evalrows} & demo and {r["phrasing"] for r in train} == set(guess.PHRASINGS)
    assert len(set(guess.PHRASINGS) - demo) >= 4
    assert {r["phrasing"] for r in guess.demo_rows(10, 0)} == demo
    assert len({r["secret"] for r in train}) == 30
    wide = guess.make_rows("eval", 20, 0, low=1, high=100)
    assert all("100" in r["prompt"] for r in wide) and max(r["secret"] for r in wide) > 30


# ---------------------------------------------------------------- python


def test_python_questions_are_held_out_and_demonstrations_run_in_the_sandbox():
    train, held_out = python.make_rows("train", 200, 0), python.make_rows("eval", 60, 0)
    assert not {r["code"] for r in train} & {r["code"] for r in held_out}  # no parameters shared
    demo_phrasings = {r["phrasing"] for r in python.demo_rows(16, 0)}
    assert len(demo_phrasings) == 4 and not demo_phrasings & {r["phrasing"] for r in held_out}
    demo = python.demonstration(held_out[3])  # the expert's program runs and prints the answer
    assert demo["messages"][2] == {"role": "tool", "name": "run_python", "content": held_out[3]["answer"]}
    env = python.PythonEnv(cpu_seconds=1)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        env.run_python("print(1 / 0)")
    assert env.run_python("x = 1") == "(the program printed nothing)"


# ---------------------------------------------------------------- determinism and the data files


@pytest.mark.parametrize("name", sorted(MODULES))
def test_rows_are_deterministic_and_match_the_data_files(name):
    module, prefix = MODULES[name], {"guess_number": "guess"}.get(name, name)
    for split in ("train", "eval"):
        rows = _read(DATA / f"{prefix}_{split}.jsonl")  # written by another process: hash seeds differ
        assert module.make_rows(split, len(rows), 0) == rows
        assert module.make_rows(split, len(rows), 1) != rows
    assert module.demo_rows(8, 0) == module.demo_rows(8, 0) != module.demo_rows(8, 1)
    if name == "search":
        assert _read(DATA / "search_docs.jsonl") == search.make_corpus(0)
