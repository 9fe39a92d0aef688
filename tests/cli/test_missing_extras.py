"""A command whose optional extra is not installed says which packages it needs and how to install them:
exit 2 and one line, not an import's traceback from inside the command (found on an install of rlft's
core alone: `rlft serve-reward` and `rlft sweep` ended in a bare ModuleNotFoundError)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.cli.test_cli import _env, assert_user_error

# each module set to None in sys.modules: `import x` fails and importlib.util.find_spec(x) is None, as on a
# machine without the package
HIDE = (
    "import sys\nfor m in {hidden!r}: sys.modules[m] = None\nfrom rlft.cli.main import main\nsys.exit(main({argv!r}))"
)


@pytest.mark.parametrize(
    "argv, hidden, named",
    [
        (["serve-reward", "--reward-config", "{reward}"], ["uvicorn"], "uvicorn"),
        (["serve-reward", "--reward-config", "{reward}"], ["fastapi", "uvicorn"], "fastapi, uvicorn"),
        (
            ["sweep", "--config", "{config}", "--grid", "algorithm.learning_rate=1e-5,2e-5", "--out", "{out}"],
            ["sqlalchemy", "alembic"],
            "sqlalchemy, alembic",
        ),
        (["serve", "--workspace", "{out}"], ["sqlalchemy"], "sqlalchemy"),
    ],
    ids=["serve-reward-uvicorn", "serve-reward-both", "sweep", "serve"],
)
def test_a_command_without_its_extra_names_what_to_install(tmp_path, tiny_config, argv, hidden, named):
    reward = tmp_path / "reward.yaml"
    reward.write_text("functions:\n  - type: builtin\n    name: exact_match\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_config))
    paths = {"reward": str(reward), "config": str(config), "out": str(tmp_path / "out")}
    argv = [a.format(**paths) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-c", HIDE.format(hidden=hidden, argv=argv)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    message = assert_user_error(proc)
    assert f"rlft {argv[0]} needs {named}: pip install 'rlft[service]'" in message
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
