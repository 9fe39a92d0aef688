"""A MultiTurnEnv whose env_response answers the model's text (rlft refuses it, saying why)."""

import verifiers as vf
from datasets import Dataset


class EchoChat(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "again"}]


def load_environment() -> vf.Environment:
    return EchoChat(dataset=Dataset.from_list([{"question": "hi", "answer": "hi"}]), max_turns=3)
