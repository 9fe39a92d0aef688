"""While a run sets up, its memory check and its job read each split's prompts once between them; outside that
scope, and whenever what the prompts depend on differs, a read is a read."""

from __future__ import annotations

import json
import os

import pytest

import rlft.data.prompts as prompts_module
from rlft.config.schema import DataConfig
from rlft.data.prompts import load_prompts
from rlft.data.read_once import read_once, setup_reads
from rlft.models.loading import load_tokenizer


@pytest.fixture
def builds(monkeypatch):
    """How many times the rows were turned into prompts (rendered and tokenized)."""
    made = []
    real = prompts_module.build_examples

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(prompts_module, "build_examples", counted)
    return made


def _data(tmp_path, n=5, **settings) -> DataConfig:
    path = tmp_path / "train.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"question {i} " + "x" * i}], "answer": str(i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DataConfig(train_file=str(path), eval_split=0.4, **settings)


@pytest.mark.parametrize("own", [True, False])  # the tokenizer's own template, or one the run puts on it
def test_a_second_read_in_the_scope_is_the_first_one_on_a_fresh_tokenizer(tmp_path, tiny_model_dir, builds, own):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] ")
    data = _data(tmp_path, chat_template="auto" if own else str(template))
    with read_once():
        planner = load_tokenizer(tiny_model_dir)  # the memory check's
        first = [load_prompts(data, planner, s, 0) for s in ("train", "eval")]
        job = load_tokenizer(tiny_model_dir)  # the job's, as it comes from the model folder
        again = [load_prompts(data, job, s, 0) for s in ("train", "eval")]
    assert len(builds) == 2  # train and eval, once each
    for a, b in zip(first, again):
        assert [e.text for e in a.examples] == [e.text for e in b.examples] and a.longest == b.longest > 0
        assert [e.columns for e in a.examples] == [e.columns for e in b.examples]
        assert a.examples is not b.examples and a.chat_template == b.chat_template
    # the template the prompts were rendered with is on the job's tokenizer, which generation uses
    assert job.chat_template == planner.chat_template
    assert (job.chat_template == load_tokenizer(tiny_model_dir).chat_template) == own
    messages = [{"role": "user", "content": "question 0 "}]
    assert first[0].examples[0].text == job.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_outside_the_scope_or_when_an_input_changes_the_data_is_read_again(tmp_path, tiny_model_dir, builds):
    data = _data(tmp_path)
    tok = load_tokenizer(tiny_model_dir)
    load_prompts(data, tok, "train", 0)
    load_prompts(data, tok, "train", 0)
    assert len(builds) == 2  # no scope: every read reads
    with read_once():
        load_prompts(data, tok, "train", 0)
        load_prompts(data, tok, "train", 1)  # another seed holds out other rows
        load_prompts(data.model_copy(update={"system_prompt": "Be brief."}), tok, "train", 0)
        assert len(builds) == 5
        # tools chosen by a function of the row: what the prompts depend on cannot be told, so never shared
        assert setup_reads(data, "train", 0, lambda row: [], tok) == (None, None)
        assert setup_reads(data, "train", 0, [{"name": "f"}], tok)[1] is not None
        path = data.train_file
        with open(path, "a") as f:
            f.write(json.dumps({"prompt": "a new row", "answer": "9"}) + "\n")
        os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1))
        grown = load_prompts(data, tok, "train", 0)
        assert len(builds) == 6 and len(grown.examples) == 4  # 6 rows, 2 held out
    with read_once():
        load_prompts(data, tok, "train", 0)  # a new scope starts empty
    assert len(builds) == 7


def test_a_scope_is_its_own_threads(tmp_path, tiny_model_dir, builds):
    """Runs set up at once in threads of one process (an in-process sweep) keep their reads apart."""
    import threading

    data, tok = _data(tmp_path), load_tokenizer(tiny_model_dir)
    with read_once():
        load_prompts(data, tok, "train", 0)
        other = threading.Thread(target=lambda: [load_prompts(data, tok, "train", 0) for _ in range(2)])
        other.start()
        other.join()
        assert len(builds) == 3  # the other thread is in no scope: each of its reads reads
        load_prompts(data, tok, "train", 0)
    assert len(builds) == 3


def test_prompts_whose_tools_follow_the_rows_environment_class_are_read_once_too(tmp_path, builds):
    """Several environment classes: each row's tools are its class's (a function of the row), which says what it
    depends on by its key, so the memory check's read is the job's; another routing is another read."""
    from rlft.envs.spec import EnvironmentSpec
    from rlft.models.tiny import build_tiny_model_dir

    games = "examples/trl/two_games.py"
    model_dir = build_tiny_model_dir(tmp_path / "chatml", chat_format="chatml")  # a template that takes tools
    rows = [{"prompt": "a", "env": "countdown", "start": 3}, {"prompt": "b", "env": "spell", "word": "ox"}]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataConfig(train_file=str(tmp_path / "g.jsonl"))

    def routed(countdown: str, spell: str) -> EnvironmentSpec:
        classes = {"countdown": (f"{games}:{countdown}", {}), "spell": (f"{games}:{spell}", {})}
        return EnvironmentSpec.load_routed(classes, "env", [])

    with read_once():
        first = load_prompts(data, load_tokenizer(model_dir), "train", 0, routed("Countdown", "Spell").prompt_tools)
        again = load_prompts(data, load_tokenizer(model_dir), "train", 0, routed("Countdown", "Spell").prompt_tools)
        assert len(builds) == 1 and [e.text for e in again.examples] == [e.text for e in first.examples]
        assert '"subtract"' in first.examples[0].text and '"letter"' in first.examples[1].text
        swapped = load_prompts(data, load_tokenizer(model_dir), "train", 0, routed("Spell", "Countdown").prompt_tools)
        assert len(builds) == 2 and '"letter"' in swapped.examples[0].text
