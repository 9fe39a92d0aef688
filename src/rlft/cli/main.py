"""The ``rlft`` command line.

    rlft train --config configs/minimal_example.yaml [--set algorithm.learning_rate=1e-5 ...]
    rlft sft --config configs/sft_tool_format.yaml   # supervised fine-tuning (same --set / --resume)
    rlft train-rm --config my_rm.yaml                 # a reward model on preference pairs (kind: rm)
    rlft dpo --config my_dpo.yaml                     # DPO on the same preference pairs (kind: dpo)
    rlft validate --config X          # check a config without loading a model
    rlft check-env                    # torch, devices, threads, optional packages
    rlft doctor [--config X] [--json] # every check with ok / warn / fail and a fix; exit 1 on a fail
    rlft estimate --config X [--device H100-80GB]   # predicted peak memory by phase; what to turn down
    rlft algorithms                   # each algorithm.name, its paper departures and the defaults it selects
    rlft generate --model C --prompt "..."          # inference (also python inference.py)
    rlft eval --config X --base --checkpoint C ...  # side-by-side evaluation, markdown + HTML report
    rlft export --checkpoint C --out DIR            # standalone HF model directory, LoRA merged
    rlft rollout --config X [--n 2]                 # play a few episodes, trained tokens marked
    rlft env demos --env calculator --n 64          # SFT warm-start demonstrations of a built-in environment
    rlft serve [--host 127.0.0.1 --port 8000 --workspace .]   # the job service + dashboard (python serve.py)
    rlft jobs submit|list|status|logs|cancel|resume ...       # its command-line client
    rlft plot RUN_DIR [RUN_DIR ...] --out plots/              # training curves as PNG
    rlft diagnose RUN_DIR [--out DIR] [--json]                # health verdict, findings, report; exit 3 if unhealthy
    rlft sweep configs/experiments/ | --config X --grid K=V1,V2  # batch runs, retries, a summary table
    rlft serve-reward --reward-config rewards.yaml            # rlft rewards over HTTP (for type: http)

User mistakes (bad config, bad data, failing reward) print one clear paragraph
to stderr and exit non-zero (2 for usage/config/data errors); only bugs in rlft
itself show a traceback. Exit 3: the run is unhealthy (rlft diagnose; rlft train with
train.health.fail_on_unhealthy).
"""

from __future__ import annotations

import argparse
import os
import sys

from rlft.cli.options import add_overrides
from rlft.errors import RlftError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="YAML config file.")
    add_overrides(p, "Override a config value, e.g. --set train.max_steps=10 (repeatable).")


# The subcommands beside the job kinds': (name, the module whose function adds its arguments, that
# function, help). Each module is imported when the parser is built.
SUBCOMMANDS: list[tuple[str, str, str, str]] = [
    ("generate", "rlft.cli.generate", "add_arguments",
     "Generate from a checkpoint or model (one prompt or a JSONL file)."),
    ("export", "rlft.cli.export", "add_arguments", "Write a checkpoint as a plain HF model dir (LoRA merged)."),
    ("eval", "rlft.cli.eval", "add_arguments", "Compare checkpoints (and --base) on the eval prompts."),
    ("rollout", "rlft.cli.agent", "add_rollout_arguments",
     "Run a few multi-turn episodes without training; print them with the trained tokens marked."),
    ("env", "rlft.cli.agent", "add_env_arguments", "Built-in environments: list, demos."),
    ("doctor", "rlft.cli.doctor", "add_arguments",
     "Check this machine (and --config's run: memory, disk) with a fix for each problem."),
    ("estimate", "rlft.cli.estimate", "add_arguments",
     "Predict a run's peak memory (weights, optimizer, activations, KV cache ...) before launch."),
    ("serve", "rlft.cli.serve", "add_arguments", "The HTTP job service and dashboard (loopback by default)."),
    ("jobs", "rlft.cli.jobs", "add_arguments", "Submit, list, watch, cancel and resume jobs of rlft serve."),
    ("serve-reward", "rlft.cli.serve_reward", "add_arguments", "Serve rlft rewards over HTTP (for type: http)."),
    ("plot", "rlft.cli.plot", "add_arguments", "Write a run's training curves (several runs overlaid) as PNG."),
    ("diagnose", "rlft.cli.diagnose", "add_arguments",
     "Check a run's health (no learning signal, collapse, blow-ups, hacking); a report with plots; "
     "exit 3 if unhealthy."),
    ("sweep", "rlft.cli.sweep", "add_arguments",
     "Run a folder of configs or a grid; classify failures, retry transient ones, summarise."),
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="rlft", description="Reinforcement-learning fine-tuning of open-weight LMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_job_commands(sub)
    validate = sub.add_parser("validate", help="Validate a config and print the resolved YAML.")
    _add_config_args(validate)
    sub.add_parser("check-env", help="Report torch, devices and optional packages.")
    sub.add_parser("algorithms", help="List the algorithms and the defaults each one selects.")
    for name, module, adder, help_text in SUBCOMMANDS:
        getattr(importlib.import_module(module), adder)(sub.add_parser(name, help=help_text))
    return parser


def _add_job_commands(sub) -> None:
    """One subcommand per job kind, as the kind declares it in JOB_KINDS."""
    from rlft.config.schema import JOB_KINDS

    for kind in JOB_KINDS.values():
        job = sub.add_parser(job_command(kind.name), help=f"Run {kind.summary} from a config (kind: {kind.name}).")
        _add_config_args(job)
        job.add_argument("--output-dir", "--output_dir", default=None, help="Override train.output_dir.")
        job.add_argument(
            "--resume",
            default=None,
            metavar="CHECKPOINT|auto",
            help="Continue from a checkpoint directory, or 'auto': the latest complete checkpoint of "
            "this config's run (a new run when there is none).",
        )
        job.add_argument(
            "--run-dir",
            default=None,
            metavar="DIR",
            help="Write the run exactly here instead of <output_dir>/<run_name> (used by rlft serve).",
        )
        job.set_defaults(kind=kind.name)


def _cmd_train(args) -> int:
    """``rlft train`` (RL) and ``rlft sft``: the same lifecycle, the kind of job set by the command."""
    from rlft.config.loader import load_config

    # The config is checked before the trainer's imports (torch, ~2-3 s): a mistake is reported at once.
    config = load_config(args.config, overrides=args.overrides, kind=args.kind)
    from rlft.trainer.trainer import Trainer

    trainer = Trainer(
        args.config,
        config=config,
        output_dir=args.output_dir,
        resume_from=args.resume,
        run_dir=args.run_dir,
    )
    result = trainer.train()
    if result.stopped_by is not None:
        from rlft.trainer.process import stop_note

        print(
            f"stopped at step {result.steps} by signal {result.stopped_by}; {stop_note(result.final_checkpoint)}",
            file=sys.stderr,
        )
        return 128 + result.stopped_by
    if result.health and result.health["verdict"] == "unhealthy" and trainer.cfg.train.health.fail_on_unhealthy:
        from rlft.health import EXIT_UNHEALTHY

        print(
            f"the run completed but is unhealthy (train.health.fail_on_unhealthy: exit {EXIT_UNHEALTHY}); "
            f"rlft diagnose {result.run_dir} for the report",
            file=sys.stderr,
        )
        return EXIT_UNHEALTHY
    return 0


def _cmd_validate(args) -> int:
    from rlft.config.loader import config_to_yaml, load_config

    print(config_to_yaml(load_config(args.config, overrides=args.overrides)), end="")
    return 0


def _cmd_check_env(args) -> int:
    from rlft.doctor.check_env import check_env

    return 0 if check_env(verbose=True)["ok"] else 1


def _cmd_algorithms(args) -> int:
    import textwrap

    from rlft.config.presets import PRESETS

    for name, preset in PRESETS.items():
        defaults = ", ".join(f"{k}={v}" for k, v in preset.defaults.items()) or "(the schema defaults)"
        print(f"{name}\n{textwrap.indent(textwrap.fill(preset.summary, 96), '    ')}\n    defaults: {defaults}\n")
    return 0


def _lazy(module: str, function: str = "run"):
    """The command ``rlft.cli.<module>.<function>``, imported only when it runs."""

    def command(args) -> int:
        import importlib

        return getattr(importlib.import_module(f"rlft.cli.{module}"), function)(args)

    return command


def job_command(kind: str) -> str:
    """The subcommand that runs a job kind: ``rlft train-rm`` -> ``train-rm``."""
    from rlft.config.schema import JOB_KINDS

    return JOB_KINDS[kind].command.removeprefix("rlft ")


COMMANDS = {
    "validate": _cmd_validate,
    "check-env": _cmd_check_env,
    "algorithms": _cmd_algorithms,
    "generate": _lazy("generate"),
    "export": _lazy("export"),
    "eval": _lazy("eval"),
    "rollout": _lazy("agent", "run_rollout"),
    "env": _lazy("agent", "run_env"),
    "serve": _lazy("serve"),
    "jobs": _lazy("jobs"),
    "plot": _lazy("plot"),
    "diagnose": _lazy("diagnose"),
    "sweep": _lazy("sweep"),
    "serve-reward": _lazy("serve_reward"),
    "estimate": _lazy("estimate"),
    "doctor": _lazy("doctor"),
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return (_cmd_train if getattr(args, "kind", None) else COMMANDS[args.command])(args)
    except RlftError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: stopped by the user (the last complete checkpoint is kept)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rlft diagnose RUN | head -1`: the reader left; no traceback, the shell's code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
