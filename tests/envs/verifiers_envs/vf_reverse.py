"""A single-turn verifiers environment, written as a verifiers user writes one (the classic API):
reverse a word, the answer in <answer> tags; rows built locally (no network dataset)."""

import verifiers as vf
from datasets import Dataset

WORDS = ["stone", "river", "cloud", "maple", "ember", "quartz", "lantern", "harbor"]


def _rows(words):
    return [{"question": f"Reverse the word: {w}", "answer": w[::-1], "info": {"length": len(w)}} for w in words]


def load_environment(n_train: int = 6, **kwargs) -> vf.Environment:
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def reversed_exactly(completion, answer, parser, **kwargs) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    def length_matches(completion, info, parser, **kwargs) -> float:
        return 1.0 if len((parser.parse_answer(completion) or "").strip()) == info["length"] else 0.0

    def group_best(completions, answers, **kwargs) -> list[float]:
        """A group reward: 1 for the completions of a prompt's group that are the longest of it."""
        lengths = [len(str(c[-1]["content"])) for c in completions]
        return [float(n == max(lengths)) for n in lengths]

    rubric = vf.Rubric(funcs=[reversed_exactly, length_matches], weights=[1.0, 0.5], parser=parser)
    rubric.add_metric(group_best)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(_rows(WORDS[:n_train])),
        eval_dataset=Dataset.from_list(_rows(WORDS[n_train:])),
        system_prompt="Think, then give the reversed word in <answer></answer> tags.",
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
