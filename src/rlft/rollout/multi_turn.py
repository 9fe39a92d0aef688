"""Multi-turn rollouts: the model answers, calls tools, reads the results, answers again.

Token in, token out: every sampled id is kept verbatim, and each tool result is appended as the
chat template's token delta (:class:`rlft.chat.deltas.TurnDeltas`), so the tokens trained on are
the tokens sampled, and only those are in the loss mask. A turn's generation stops right after its
last allowed ``</tool_call>`` (or if the model starts a ``<tool_response>`` itself), so the model
never writes its own tool output into the context.

All live episodes decode as one batch. The first turns of a group share one prefill; an episode
whose turn ends with tool calls leaves the batch with its KV cache kept, its calls run in its
environment worker while the others decode, and it rejoins with only the new tokens to read.
Episodes that finish leave for good; one waiting on a slow tool stalls nobody.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait as wait_any

import torch

from rlft.chat.deltas import TurnDeltas
from rlft.envs.spec import EnvironmentSpec
from rlft.envs.worker import episode_worker
from rlft.errors import EnvironmentFailure
from rlft.rollout.base import RolloutBatch, SamplingParams
from rlft.rollout.episode import DONE, READY, RUNNING, WAITING, Episode, EpisodeLimits
from rlft.rollout.episode_batch import batch_of
from rlft.rollout.kv import FusedKVBatch, KVBatch, start_batch
from rlft.rollout.sampling import row_uniforms, sample_next
from rlft.speed.clock import phase

RESPONSE_OPEN = "<tool_response>"
ADMIT_EVERY = 8


class EpisodeRunner:
    """Runs examples as episodes with a :class:`NativeEngine`'s model and tokenizer.

    prompt_for(example, observation) -> the rendered prompt (``observation``: what ``reset``
    returned, appended to the last user message, or None); row_for(example) -> the data row given
    to ``reset(**row)`` (with several environment classes, it also picks the row's class).
    keep_environments: hand the rewards a copy of each episode's environment instance at its end
    (the ``environments`` column, TRL's ``environments=``)."""

    def __init__(
        self,
        engine,
        spec: EnvironmentSpec,
        limits: EpisodeLimits,
        *,
        prompt_for,
        row_for,
        isolation: str = "process",
        keep_environments: bool = False,
    ):
        self.engine, self.spec, self.limits = engine, spec, limits
        self.prompt_for, self.row_for, self.isolation = prompt_for, row_for, isolation
        self.keep_environments = keep_environments
        self.tokenizer = engine.tokenizer
        self._deltas: dict[int, TurnDeltas] = {}
        vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        self._closing_ids = {i for i, t in enumerate(vocab) if t and ">" in t}  # may end </tool_call>

    # ------------------------------------------------------------------ public

    def run(self, examples: list, sampling: SamplingParams) -> RolloutBatch:
        episodes = self._start(examples, sampling)
        try:
            fused = self.engine.fused_decoder()
            with self.engine.generating(fused[0] if fused else None) as model:
                self._prefill = start_batch(self.engine, model, fused)
                self._loop(episodes, sampling)
        finally:
            self._prefill = None
            self._finish_workers(episodes)
        return self._batch(episodes)

    def release_memory(self) -> None:
        """The engine's memory to the update between rollouts (:meth:`NativeEngine.release_memory`)."""
        self.engine.release_memory()

    # ------------------------------------------------------------------ start and end

    def _start(self, examples: list, sampling: SamplingParams) -> list[Episode]:
        """Reset one environment per episode, all G of a group with the same row and seed (with
        ``sampling.seed``, a function of it and the group's global number, like the tokens)."""
        n = sampling.n
        if sampling.seed is None:
            seeds = torch.randint(0, 2**31 - 1, (len(examples),)).tolist()
        else:
            groups = torch.arange(len(examples)) + sampling.row_offset // n
            seeds = (row_uniforms(sampling.seed, groups, -1) * (2**31 - 1)).long().tolist()
        rows = [self.row_for(ex) for ex in examples]
        specs = [self._spec_of(row, ex) for row, ex in zip(rows, examples)]
        episodes = [
            Episode(g * n + j, g, episode_worker(specs[g], self.isolation), spec=specs[g])
            for g in range(len(examples))
            for j in range(n)
        ]
        for ep in episodes:
            ep.worker.send("reset", rows[ep.group], seeds[ep.group])
        prompts: dict[tuple[int, str | None], list[int]] = {}
        for ep in episodes:
            # The first request also builds the environment (an index, a connection): it gets the
            # whole episode's time, not one tool call's.
            with phase("environment"):
                reply = ep.worker.receive(self.limits.episode_timeout)
            if not reply.ok:
                self._abort(episodes)
                source = getattr(examples[ep.group], "source", "") or f"row {ep.group}"
                raise EnvironmentFailure(
                    f"environment '{ep.spec.name}': reset failed on data row {source}: {reply.value}"
                )
            key = (ep.group, reply.value)
            if key not in prompts:
                text = self.prompt_for(examples[ep.group], reply.value)
                ids = self.tokenizer(text, add_special_tokens=self.engine.add_special_tokens)["input_ids"]
                prompts[key] = list(ids[-self.engine.max_prompt_length :])
            ep.prompt_ids = prompts[key]
            ep.pending = list(ep.prompt_ids)
        return episodes

    def _spec_of(self, row: dict, example) -> EnvironmentSpec:
        """The row's environment (with several classes, the one its route column names)."""
        try:
            return self.spec.for_row(row)
        except EnvironmentFailure as exc:
            source = getattr(example, "source", "") or "a data row"
            raise EnvironmentFailure(f"{source}: {exc}") from None

    def _deltas_for(self, spec: EnvironmentSpec) -> TurnDeltas:
        if id(spec) not in self._deltas:
            self._deltas[id(spec)] = TurnDeltas(self.tokenizer, spec.schemas)
        return self._deltas[id(spec)]

    def _abort(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            ep.worker.kill()

    def _finish_workers(self, episodes: list[Episode]) -> None:
        """Ask every live environment for its reward (and, for rewards that read them, a copy of
        itself), then close it; a dead one scores 0."""
        asked = [ep for ep in episodes if ep.worker.alive and ep.spec.has_reward]
        for ep in asked:
            ep.worker.send("reward")
        for ep in asked:
            reply = ep.worker.receive(self.limits.tool_timeout)
            ep.env_reward = float(reply.value) if reply.ok and reply.value is not None else 0.0
            if not reply.ok:
                ep.messages.append(
                    {
                        "role": "tool",
                        "name": "get_reward",
                        "error": True,
                        "content": f"error: get_reward failed: {reply.value}",
                    }
                )
        if self.keep_environments:
            self._collect_environments(episodes)
        for ep in episodes:
            if ep.worker.alive:
                ep.worker.close()
            if ep.spec.has_reward and ep.env_reward is None:
                ep.env_reward = 0.0

    def _collect_environments(self, episodes: list[Episode]) -> None:
        """Each episode's environment instance as it ended, copied out of its worker (see
        :mod:`rlft.envs.snapshot`); a :class:`LostEnvironment` where there is none to copy."""
        from rlft.envs.snapshot import restore

        asked = [ep for ep in episodes if ep.worker.alive and ep.spec.env_class is not None]
        for ep in asked:
            ep.worker.send("snapshot")
        for ep in episodes:
            if ep in asked:
                reply = ep.worker.receive(self.limits.tool_timeout)
                blob, why = (reply.value, "") if reply.ok else (None, f"it could not be copied ({reply.value})")
            elif ep.spec.env_class is None:
                blob, why = None, "the episode has no environment class"
            else:
                blob, why = None, f"its worker is gone (the episode ended '{ep.stats.finish}')"
            ep.environment = restore(blob, why)

    # ------------------------------------------------------------------ the loop

    def _loop(self, episodes: list[Episode], sampling: SamplingParams) -> None:
        running: KVBatch | FusedKVBatch | None = None
        rows: list[Episode] = []
        logits = None
        held = 0  # decode steps the ready episodes have waited to join
        while True:
            self._poll_tools(episodes)
            self._expire(episodes)
            ready = [ep for ep in episodes if ep.state == READY]
            # Joining copies the whole batch's cache, so episodes coming back from their tools join
            # together: at once if nothing is decoding or they are as many as the running rows,
            # else after ADMIT_EVERY steps.
            if ready and (not rows or len(ready) >= len(rows) or held >= ADMIT_EVERY):
                running, rows, logits = self._admit(ready, running, rows, logits)
                held = 0
            elif ready:
                held += 1
            if not rows:
                waiting = [ep for ep in episodes if ep.state == WAITING]
                if not waiting:
                    return
                self._wait_for_any(waiting)
                continue
            tokens, logprobs = self._sample(logits, sampling, rows)
            ended = self._append(rows, tokens.tolist(), logprobs.tolist(), sampling.max_new_tokens)
            if not ended:
                logits = running.step(tokens)
                continue
            for b in ended:
                if rows[b].state != DONE:  # it comes back after its tools: keep what the model has read
                    rows[b].cached = running.row(b)
            keep = [b for b in range(len(rows)) if b not in set(ended)]
            if not keep:
                running, rows, logits = None, [], None
                continue
            idx = torch.tensor(keep, device=tokens.device)
            running.select(idx)
            rows = [rows[b] for b in keep]
            logits = running.step(tokens[idx])

    def _sample(self, logits: torch.Tensor, sampling: SamplingParams, rows: list[Episode]):
        """Tokens [B] and their log-probs [B] for the running rows (tests script this)."""
        kernels = self.engine.kernels()
        if sampling.seed is None:
            return sample_next(logits, sampling, kernels=kernels)
        rows_at = torch.tensor([sampling.row_offset + ep.index for ep in rows])
        positions = torch.tensor([len(ep.tokens) for ep in rows])
        return sample_next(logits, sampling, u=row_uniforms(sampling.seed, rows_at, positions), kernels=kernels)

    def _append(self, rows: list[Episode], tokens: list[int], logprobs: list[float], max_turn_tokens: int) -> list[int]:
        """Add each row's sampled token; the rows whose turn (or episode) ended."""
        ended = []
        eos = set(self.engine.eos_ids)
        for b, (ep, tok, lp) in enumerate(zip(rows, tokens, logprobs)):
            if ep.state == DONE:  # expired while decoding
                ended.append(b)
                continue
            ep.add_sampled(tok, lp)
            is_eos = tok in eos
            stop = is_eos or len(ep.turn_tokens) >= max_turn_tokens or self._stops_turn(ep, tok)
            if len(ep.tokens) >= self.limits.max_episode_tokens and not stop:
                ep.final_text = self._decode(ep.turn_tokens)
                ep.messages.append({"role": "assistant", "content": ep.final_text})
                ep.stats.turns += 1
                ep.finish("budget")
                ended.append(b)
            elif stop:
                self._end_turn(ep, is_eos)
                ended.append(b)
        return ended

    def _stops_turn(self, ep: Episode, tok: int) -> bool:
        if tok not in self._closing_ids:
            return False
        text = self._decode(ep.turn_tokens)
        return text.count("</tool_call>") >= self.limits.max_calls_per_turn or RESPONSE_OPEN in text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _end_turn(self, ep: Episode, is_eos: bool) -> None:
        text = self._decode(ep.turn_tokens)
        if RESPONSE_OPEN in text:  # the model began writing a tool result: that part is not its turn
            text = text[: text.index(RESPONSE_OPEN)]
        ep.end_turn(text, is_eos, ep.spec.schemas, self.limits.max_turns)
        if ep.state == WAITING:
            self._dispatch(ep)

    # ------------------------------------------------------------------ tools

    def _dispatch(self, ep: Episode) -> None:
        """Send the next queued call, or (none left) turn the results into the next turn's input."""
        if ep.queue:
            call = ep.queue.pop(0)
            ep.current_call = call.name
            ep.worker.send("call", call.name, call.arguments)
            return
        ep.messages += ep.results
        if ep.state == DONE:
            return
        delta = self._deltas_for(ep.spec).after_turn(
            [{k: m[k] for k in ("role", "name", "content")} for m in ep.results], ep.ended_with_eos
        )
        ids = self.tokenizer(delta, add_special_tokens=False)["input_ids"]
        if len(ep.tokens) + len(ids) + 1 > self.limits.max_episode_tokens:
            ep.finish("budget")  # the result would not fit: roll it back rather than cut the context
            return
        last = ep.tokens[-1]
        ep.add_observation(ids)
        ep.pending = [last] + ids
        ep.results, ep.turn_start, ep.state = [], len(ep.tokens), READY

    def _poll_tools(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            while ep.state == WAITING and getattr(ep, "current_call", None) is not None:
                if not ep.worker.poll() and ep.worker.waited() < self.limits.tool_timeout:
                    break
                self._receive(ep)

    def _receive(self, ep: Episode) -> None:
        name = ep.current_call
        ep.current_call = None
        reply = ep.worker.receive(self.limits.tool_timeout)
        if reply.timed_out:
            ep.stats.tool_timeouts += 1
            _end_on_tool_error(ep, name, f"error: {name} timed out after {self.limits.tool_timeout:g}s", "tool_timeout")
            return
        if reply.crashed:  # no environment left to call: the episode ends here, through no fault of the model's
            ep.stats.tool_errors += 1
            _end_on_tool_error(ep, name, f"error: {reply.value}", "env_error")
            return
        if reply.ok:
            ep.results.append(ep.tool_result(name, reply.value, self.tokenizer, self.limits.max_tool_response_tokens))
        else:
            ep.results.append(ep.error_result(name, reply.value))
        if reply.done:
            ep.messages += ep.results
            ep.results = []
            ep.finish("done")
            return
        self._dispatch(ep)

    def _wait_for_any(self, waiting: list[Episode]) -> None:
        """Block until a waiting episode's tool replies or the nearest timeout passes."""
        now = time.monotonic()
        left = min(
            min(self.limits.tool_timeout - ep.worker.waited(), self.limits.episode_timeout - (now - ep.started))
            for ep in waiting
        )
        left = max(0.0, left)
        conns = [ep.worker.connection for ep in waiting if ep.worker.connection is not None]
        if conns:
            with phase("environment"):
                wait_any(conns, timeout=left + 0.01)

    def _expire(self, episodes: list[Episode]) -> None:
        now = time.monotonic()
        for ep in episodes:
            if ep.state != DONE and now - ep.started > self.limits.episode_timeout:
                if ep.state == WAITING:
                    ep.worker.kill()
                ep.finish("timeout")

    # ------------------------------------------------------------------ admission

    def _admit(self, ready: list[Episode], running: KVBatch | FusedKVBatch | None, rows: list[Episode], logits):
        """Prefill the ready episodes' pending tokens (identical first prompts once) and join them
        to the running batch."""
        unique: dict[tuple[int, ...], int] = {}
        firsts = []
        for ep in ready:
            key = tuple(ep.pending) if ep.cached is None else (id(ep),)
            firsts.append(unique.setdefault(key, len(unique)))
        leaders = {}
        for ep, u in zip(ready, firsts):
            leaders.setdefault(u, ep)
        order = [leaders[u] for u in range(len(unique))]
        batch, new_logits = self._prefill([ep.cached for ep in order], [ep.pending for ep in order])
        if len(order) < len(ready):
            idx = torch.tensor(firsts, device=new_logits.device)
            batch.select(idx)
            new_logits = new_logits[idx]
        for ep in ready:
            ep.state, ep.cached, ep.pending = RUNNING, None, []
            ep.turn_start = len(ep.tokens)
        if running is None:
            return batch, list(ready), new_logits
        return running.join(batch), rows + list(ready), torch.cat([logits, new_logits])

    # ------------------------------------------------------------------ output

    def _batch(self, episodes: list[Episode]) -> RolloutBatch:
        columns = {"trajectories": [ep.messages for ep in episodes]}
        if self.spec.has_reward:  # None where the episode's class has no get_reward(): it does not apply
            columns["environment_reward"] = [ep.env_reward for ep in episodes]
        if self.keep_environments:
            columns["environments"] = [ep.environment for ep in episodes]
        return batch_of(episodes, self.engine.pad_id, self.engine.device, columns)


def _end_on_tool_error(ep: Episode, name: str, text: str, finish: str) -> None:
    """End ``ep`` with the call's error as the last tool message (the trajectory shows why it ended)."""
    ep.messages += ep.results + [{"role": "tool", "name": name, "error": True, "content": text}]
    ep.results = []
    ep.finish(finish)
