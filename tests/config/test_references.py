"""Every config field that names a file, folder, model, code or URL is typed as a reference, so the one
check of the job service (rlft.service.workspace.Workspace.check_config) sees it; a new string field
must be classified here or it fails this test."""

from __future__ import annotations

import inspect
import typing

import pytest
from pydantic import BaseModel

from rlft.config.environment import BUILTIN_ENVIRONMENT_NAMES, BUILTIN_KWARG_REFERENCES
from rlft.config.loader import load_config
from rlft.config.references import field_reference, leaf_types, references
from rlft.config.schema import JOB_KINDS

# String fields that hold text, names or patterns, never a location. A new field that names a file,
# folder, model, module or URL does not belong here: type it as a Reference (rlft.config.references).
PLAIN_TEXT = {
    "model.device",
    "model.lora.target_modules",
    "data.prompt_field",
    "data.messages_field",
    "data.system_prompt",
    "data.tools_field",
    "data.response_field",
    "data.chosen_field",
    "data.rejected_field",
    "data.margin_field",
    "train.tracking.project",
    "eval.accuracy_reward",
    "reward.functions.name",
    "reward.functions.keyword",
    "reward.functions.pattern",
    "reward.functions.answer_field",
    "reward.functions.marker",
    "reward.functions.required_tags",
    "reward.functions.tools_field",
    "reward.functions.api_model",
    "reward.functions.rubric",
    "reward.functions.score_pattern",
    "reward.functions.device",
    # request headers, and keyword arguments handed to the user's own code (which must itself lie in the
    # workspace); a built-in environment's path arguments are references (BUILTIN_KWARG_REFERENCES)
    "reward.functions.headers",
    "reward.functions.kwargs",
    "reward.functions.args",
    "environment.kwargs",
    # several environment classes: their names (the keys), their constructors' keyword arguments, and the
    # data column that names each row's (environment.classes.<name>.class is a code reference)
    "environment.classes",
    "environment.classes.kwargs",
    "environment.route_column",
    # an MCP server's tool names, HTTP headers and its program's environment variables (the job service
    # starts only Python servers from its workspace: the program is the reference that is policed)
    "environment.mcp_servers.tools",
    "environment.mcp_servers.headers",
    "environment.mcp_servers.env",
}


def _string_fields(model: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """dotted path -> the field's Reference (or None) of every field of ``model`` that can hold a string."""
    found: dict[str, object] = {}
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{info.alias or name}"
        for leaf in leaf_types(info.annotation):
            if isinstance(leaf, type) and issubclass(leaf, BaseModel):
                found.update(_string_fields(leaf, dotted + "."))
            elif leaf in (str, typing.Any):
                found[dotted] = found.get(dotted) or field_reference(model, name)
    return found


def _all_string_fields() -> dict[str, object]:
    fields: dict[str, object] = {}
    for kind in JOB_KINDS.values():
        for dotted, ref in _string_fields(kind.config).items():
            fields[dotted] = fields.get(dotted) or ref
    return fields


def test_every_string_field_is_a_reference_or_known_plain_text():
    fields = _all_string_fields()
    unclassified = sorted(d for d, ref in fields.items() if ref is None and d not in PLAIN_TEXT)
    assert not unclassified, (
        f"{unclassified}: type each as a Reference (FilePath, OutputDir, ModelPath, CodeRef, "
        f"UrlRef, ...) if it names a location, else add it to PLAIN_TEXT"
    )
    assert not sorted(d for d in PLAIN_TEXT if d not in fields), "PLAIN_TEXT names a field that no longer exists"
    refs = {d: ref.kind for d, ref in fields.items() if ref is not None}
    assert refs == {
        "model.path": "model",
        "data.train_file": "file",
        "data.eval_file": "file",
        "data.chat_template": "file",
        "train.output_dir": "dir",
        "train.run_name": "run_name",
        "train.tracking.mlflow_tracking_uri": "store",
        "algorithm.critic.model_path": "model",
        "reward.functions.function": "code",
        "reward.functions.env": "code",
        "reward.functions.url": "url",
        "reward.functions.path": "model",
        "reward.functions.model": "model",
        "environment.class": "code",
        "environment.classes.class": "code",
        "environment.tools": "code",
        "environment.mcp_servers.command": "command",
        "environment.mcp_servers.cwd": "dir",
        "environment.mcp_servers.url": "url",
    }


def test_every_builtin_environment_argument_is_a_reference_or_plain_data():
    import importlib

    from rlft.envs.builtin import BUILTIN_ENVIRONMENTS

    plain = {
        "calculator": set(),
        "guess_number": {"low", "high", "progress_weight"},
        "search": set(),
        "openenv": {"timeout"},
        "python": {"cpu_seconds", "wall_seconds", "memory_mb", "output_bytes"},
        "verifiers": {"args"},
    }
    assert set(BUILTIN_ENVIRONMENTS) == set(BUILTIN_ENVIRONMENT_NAMES)
    for name, env in BUILTIN_ENVIRONMENTS.items():
        # the kwargs go to the class, or to an adapter's tools function
        module, _, attr = (env.env_class or env.tools).partition(":")
        target = getattr(importlib.import_module(module), attr)
        params = set(inspect.signature(target.__init__ if env.env_class else target).parameters) - {"self"}
        assert params == plain[name] | set(BUILTIN_KWARG_REFERENCES.get(name, {})), name


def _rl(**sections) -> dict:
    cfg = {"data": {"train_file": "d.jsonl"}, "reward": {"functions": [{"type": "contains", "keyword": "a"}]}}
    return {**cfg, **sections}


def test_references_walks_lists_unions_and_builtin_arguments_and_skips_builtin_names():
    cfg = load_config(
        data=_rl(
            reward={
                "functions": [
                    {"type": "custom", "function": "r.py:f"},
                    {"type": "judge", "model": "judge"},
                    {"type": "judge", "model": "smollm2-135m-instruct", "name": "j2"},
                    {"type": "http", "url": "http://127.0.0.1:1/score"},
                ]
            },
            environment={
                "class": "search",
                "tools": ["t.py:a", "t.py:b"],
                "kwargs": {"docs": "c.jsonl", "k": "x"},
                "mcp_servers": [{"command": ["python", "my server.py"], "cwd": "srv"}, {"url": "http://h:9/mcp"}],
            },
            train={"run_name": "exp/1", "tracking": {"mlflow_tracking_uri": "sqlite:///m.db"}},
        ),
        check_files=False,
    )
    found = {d: v for d, _, v in references(cfg)}
    assert found == {
        "data.train_file": "d.jsonl",
        "train.output_dir": "./outputs",
        "train.run_name": "exp/1",
        "train.tracking.mlflow_tracking_uri": "sqlite:///m.db",
        "reward.functions.0.function": "r.py:f",
        "reward.functions.1.model": "judge",
        "reward.functions.3.url": "http://127.0.0.1:1/score",
        "environment.tools.0": "t.py:a",
        "environment.tools.1": "t.py:b",
        "environment.kwargs.docs": "c.jsonl",
        "environment.mcp_servers.0.command": "python 'my server.py'",  # one program, however many words
        "environment.mcp_servers.0.cwd": "srv",
        "environment.mcp_servers.1.url": "http://h:9/mcp",
    }


@pytest.mark.parametrize("name", ["/tmp/run", "../up", "a/../../b", "~/run", " "])
def test_run_name_must_stay_below_the_output_folder(name):
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(data=_rl(train={"run_name": name}), check_files=False)
    assert err.value.problems[0].startswith("train.run_name: must be a relative folder name below train.output_dir")


@pytest.mark.parametrize("kind", list(JOB_KINDS))
def test_the_written_config_reads_back_as_the_same_config_for_every_kind(kind):
    """config_to_yaml wrote no rm: or dpo: section, so a DPO job of the service ran at the default beta."""
    from rlft.config.loader import config_to_yaml
    from rlft.config.yamlio import load_yaml_text

    own = {
        "rm": {"rm": {"learning_rate": 3e-6}},
        "dpo": {"dpo": {"beta": 0.5}},
        "sft": {"sft": {"learning_rate": 3e-6}},
        "rl": {"algorithm": {"learning_rate": 3e-6}, "reward": {"functions": [{"type": "contains", "keyword": "a"}]}},
    }
    cfg = load_config(data={"kind": kind, "data": {"train_file": "d.jsonl"}, **own[kind]}, check_files=False)
    again = load_config(data=load_yaml_text(config_to_yaml(cfg)), check_files=False)
    assert again == cfg


def test_references_walks_several_environment_classes_by_name():
    """Each of several environment classes is a code reference (a built-in's path arguments too), so the
    job service polices them like one class."""
    cfg = load_config(
        data=_rl(
            environment={
                "classes": {
                    "word": "games.py:Wordle",
                    "lookup": {"class": "search", "kwargs": {"docs": "d/docs.jsonl"}},
                    "maths": {"class": "calculator"},
                },
                "route_column": "task",
            }
        ),
        check_files=False,
    )
    found = {d: v for d, _, v in references(cfg) if d.startswith("environment.")}
    assert found == {
        "environment.classes.word.class": "games.py:Wordle",
        "environment.classes.lookup.kwargs.docs": "d/docs.jsonl",
    }
