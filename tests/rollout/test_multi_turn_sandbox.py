"""The built-in python environment in episodes (tiny ChatML model, scripted turns): code that the
sandbox refuses or stops comes back to the model as a tool error, counted as one, and the episode
and its neighbours go on."""

from __future__ import annotations

from rlft.envs.spec import EnvironmentSpec
from rlft.rollout.base import SamplingParams
from rlft.rollout.episode import EpisodeLimits
from tests.rollout.test_multi_turn import Ex, ScriptedRunner, call


def test_contained_code_is_a_tool_error_and_the_run_goes_on(engine):
    from rlft.chat.templates import render

    # The wall clock is far off so that the CPU limit fires first even on a loaded CI machine.
    spec = EnvironmentSpec.load("python", [], {"cpu_seconds": 1, "wall_seconds": 40})
    runner = ScriptedRunner(
        engine, spec, EpisodeLimits(tool_timeout=60.0), prompt_for=lambda ex, obs: ex.text, row_for=lambda ex: {}
    )
    runner.scripts = {
        0: [call("run_python", code="import os\nwhile True: os.fork()"), "I could not."],
        1: [call("run_python", code="while True: pass"), "Too slow."],
        2: [call("run_python", code="print(6 * 7)"), "42"],
    }
    text = render(engine.tokenizer, [{"role": "user", "content": "q"}], tools=spec.schemas, add_generation_prompt=True)
    batch = runner.run([Ex("q", text)] * 3, SamplingParams(max_new_tokens=200, n=1))
    assert batch.finish_reasons == ["answered", "answered", "answered"]
    results = [[m for m in t if m["role"] == "tool"][0] for t in batch.columns["trajectories"]]
    assert results[0]["error"] and "refused: starting or signalling processes" in results[0]["content"]
    assert results[1]["error"] and "over the CPU-time limit of 1s" in results[1]["content"]
    assert results[2]["content"] == "42" and not results[2].get("error")
    assert [e.tool_errors for e in batch.episodes] == [1, 1, 0]
