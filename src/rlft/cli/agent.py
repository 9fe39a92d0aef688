"""``rlft rollout`` (a few episodes without training, the trained tokens marked) and ``rlft env``
(the built-in environments: list them, write SFT warm-start demonstrations; a verifiers environment's
rows and a config that trains on it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlft.cli.options import add_overrides
from rlft.errors import UsageError


def add_rollout_arguments(p) -> None:
    p.add_argument("--config", "-c", required=True, help="An RL config with an environment: section.")
    add_overrides(p)
    p.add_argument("--n", type=int, default=2, help="Episodes to run (default 2).")
    p.add_argument("--split", choices=("train", "eval"), default="train", help="Which rows to play.")
    p.add_argument("--greedy", action="store_true", help="Greedy decoding instead of the training sampler.")
    p.add_argument("--model", default=None, help="A checkpoint or model to play with (default: model.path).")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="Trained tokens in colour (auto: on a terminal), else between [[ and ]].",
    )


def add_env_arguments(p) -> None:
    sub = p.add_subparsers(dest="env_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="The built-in environments.")
    demos = sub.add_parser("demos", help="Write expert demonstrations (SFT rows) for a built-in environment.")
    demos.add_argument("--env", required=True, help="A built-in environment name.")
    demos.add_argument("--n", type=int, default=64, help="How many (default 64).")
    demos.add_argument("--seed", type=int, default=0)
    demos.add_argument("--out", default=None, help="Output JSONL (default data/<env>_demos.jsonl).")
    demos.add_argument("--kwargs", default="{}", help="Environment constructor arguments as JSON.")
    vf = sub.add_parser(
        "verifiers",
        help="Write a verifiers environment's data (train/eval JSONL) and a config that trains on it.",
    )
    vf.add_argument("name", help="An installed verifiers environment (module or Hub id) or path/to/env.py.")
    vf.add_argument("--args", default="{}", help="Keyword arguments of its load_environment(), as JSON.")
    vf.add_argument("--out", default=None, help="Output folder (default data/<name>).")
    vf.add_argument("--model", default="smollm2-135m-instruct", help="model.path of the config written.")


def run_env(args) -> int:
    from rlft.envs.builtin import BUILTIN_ENVIRONMENTS, builtin_module

    if args.env_command == "list":
        for env in BUILTIN_ENVIRONMENTS.values():
            print(f"{env.name:14s} {env.summary}")
        return 0
    if args.env_command == "verifiers":
        return _write_verifiers(args)
    if args.env not in BUILTIN_ENVIRONMENTS:
        raise UsageError(f"--env: unknown environment '{args.env}' (built-in: {', '.join(BUILTIN_ENVIRONMENTS)})")
    if args.n < 1:
        raise UsageError("--n must be at least 1")
    try:
        kwargs = json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kwargs: not JSON ({exc})") from None
    module = builtin_module(args.env)
    if not hasattr(module, "demo_rows"):
        raise UsageError(
            f"--env: '{args.env}' has no demonstrations (an adapter: its task lives on a server or in a "
            f"verifiers environment)"
        )
    rows = [module.demonstration(r, **kwargs) for r in module.demo_rows(args.n, args.seed)]
    from rlft.atomic import write_text_atomic

    out = Path(args.out or f"data/{args.env}_demos.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} demonstrations to {out}")
    return 0


def _write_verifiers(args) -> int:
    """``rlft env verifiers NAME``: the environment's rows, and a config naming its rubric as the reward
    (and, for a ToolEnv, its tools as the environment)."""
    from rlft.atomic import write_text_atomic
    from rlft.config.yamlio import dump_yaml
    from rlft.envs import verifiers

    try:
        env_args = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--args: not JSON ({exc})") from None
    if not isinstance(env_args, dict):
        raise UsageError("--args: give a JSON object of load_environment()'s keyword arguments")
    out = Path(args.out or f"data/{Path(args.name).stem}")
    counts = verifiers.export_rows(args.name, env_args, out)
    loaded = verifiers.environment(args.name, env_args)
    source = {"env": args.name, "args": env_args}
    config: dict = {
        "model": {"path": args.model},
        "data": {"train_file": str(out / "train.jsonl"), "prompt_field": "prompt"},
        "algorithm": {"name": "grpo", "rollout_batch_size": 4, "num_generations": 8, "max_new_tokens": 256},
        "reward": {"functions": [{"type": "verifiers", **source}]},
        "train": {"max_steps": 20, "output_dir": "./outputs", "run_name": Path(args.name).stem},
    }
    if "eval" in counts:
        config["data"]["eval_file"] = str(out / "eval.jsonl")
    if verifiers.is_tool_env(loaded):
        turns = loaded.max_turns if loaded.max_turns > 0 else 4
        config["environment"] = {"class": "verifiers", "kwargs": source, "max_turns": turns}
    write_text_atomic(out / "config.yaml", dump_yaml(config))
    rows = ", ".join(f"{n} {split} rows" for split, n in counts.items())
    print(f"wrote {rows} and config.yaml ({type(loaded).__name__}) to {out}")
    print(f"train: rlft train --config {out / 'config.yaml'}")
    return 0


def run_rollout(args) -> int:
    import torch

    from rlft.config.loader import load_config
    from rlft.rl.build import build_data
    from rlft.rollout import SamplingParams
    from rlft.trainer.job import job_class
    from rlft.trainer.parts import build_model

    cfg = load_config(args.config, overrides=args.overrides)
    if getattr(cfg, "environment", None) is None:
        raise UsageError(f"{args.config} has no environment: section; rlft rollout plays multi-turn episodes")
    if args.n < 1:
        raise UsageError("--n must be at least 1")
    model_cfg = cfg.model if args.model is None else cfg.model.model_copy(update={"path": args.model})
    parts = build_model(model_cfg, with_reference=False)
    train, evalset = build_data(cfg, parts.tokenizer)
    rows = (evalset or train).examples if args.split == "eval" else train.examples
    job = job_class(cfg)
    runner = job.generation(cfg).make_engine(parts.model, parts.tokenizer, parts.autocast_dtype)
    rewards = job.reward_manager(cfg)
    alg = cfg.algorithm
    sampling = SamplingParams(
        max_new_tokens=alg.max_new_tokens,
        n=1,
        temperature=alg.temperature,
        top_p=alg.top_p,
        top_k=alg.top_k,
        greedy=args.greedy,
    )
    torch.manual_seed(cfg.train.seed)
    examples = rows[: args.n]
    batch = runner.run(examples, sampling)
    from rlft.evaluation import columns_of

    scored = rewards.score(
        [ex.prompt for ex in examples], batch.texts, {**columns_of(examples), **(batch.columns or {})}
    )
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for i, ex in enumerate(examples):
        print(
            format_episode(
                batch, i, parts.tokenizer, color, ex.source, {k: float(v[i]) for k, v in scored.per_reward.items()}
            )
        )
    return 0


def format_episode(batch, row: int, tokenizer, color: bool, source: str, rewards: dict[str, float]) -> str:
    """One episode as text: the prompt, then the completion with the trained (model-sampled) spans in
    green, or between ``[[`` and ``]]`` without colour; then its statistics and rewards."""
    real = batch.completion_mask[row].bool()
    ids = batch.completion_ids[row][real].tolist()
    trained = batch.loss_mask[row][real].tolist()
    prompt = tokenizer.decode(batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist())
    parts, start = [], 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or trained[k] != trained[start]:
            text = tokenizer.decode(ids[start:k])
            if trained[start]:
                text = f"\x1b[32m{text}\x1b[0m" if color else f"[[{text}]]"
            parts.append(text)
            start = k
    stats = batch.episodes[row]
    head = f"===== episode {row} ({source}) ====="
    legend = "trained tokens in green" if color else "trained tokens between [[ and ]]"
    n_model, n_obs = stats.model_tokens, stats.observation_tokens
    tail = (
        f"----- finish: {stats.finish}; turns {stats.turns}, tool calls {stats.tool_calls} "
        f"({stats.tool_errors} errors, {stats.tool_timeouts} timeouts), tokens: {n_model} trained, "
        f"{n_obs} observation; rewards: " + ", ".join(f"{k} {v:g}" for k, v in rewards.items())
    )
    return "\n".join([head, f"({legend}; the prompt is context)", prompt + "".join(parts), tail, ""])
