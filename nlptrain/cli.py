"""Command line: `python -m nlptrain {train,eval,...}`, the same under `torchrun -m nlptrain`.

The commands and their options. How each end of a command is said (its exit code, the launcher
told) is in command_end.py; the task's own options (`--lr 3e-5`, `--set section.key=value`,
`--task`) and how they make a task, in task_options.py.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from nlptrain import command_end
from nlptrain.command_end import flush_stdout
from nlptrain.errors import ConfigError, NlptrainError, RemoteRankError, every_local_rank
from nlptrain.kinds import KINDS
from nlptrain.launch import add_launch_options, tell_exit
from nlptrain.logs import add_log_level
from nlptrain.option_types import positive_seconds
from nlptrain.startup import import_libraries
from nlptrain.task_options import add_task_options, resolve_task
from nlptrain.usage_errors import CommandParser, refuse_options_before_command, refuse_unknown
from nlptrain.user_callbacks import absolute_spec, check_file, make_callback
from nlptrain.version import __version__

# Commands in modules of their own: each has `add_command(commands)` and imports torch lazily.
MORE_COMMANDS: tuple[str, ...] = ("nlptrain.data.split", "nlptrain.plots", "nlptrain.predict")

EPILOG = """examples:
  python -m nlptrain train                                  # the default task on data/
  python -m nlptrain train --task rt-polarity --data-dir ../shared/data --epochs 2
  python -m nlptrain train --nproc 2 --task sst2 --data-dir DATA   # 2 processes (DDP)
  torchrun --nproc_per_node 2 -m nlptrain train --task sst2 --data-dir DATA
  python -m nlptrain train --task my.toml --set train.lr=3e-5 --output-dir runs/mine
  python -m nlptrain eval --model runs/RUN/model --task rt-polarity --data-dir DATA
"""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="task file, or the name of one in tasks/ (default: the "
                        "small sentiment set in data/; train --resume, and eval of a run's "
                        "model/: the run's own)")
    parser.add_argument("--data-dir", help="folder the task's data paths start from "
                        "(default: the task's data_dir, or $NLPTRAIN_DATA_DIR)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="set any task key, e.g. --set data.labels='[\"neg\",\"pos\"]'")
    parser.add_argument("--no-cache", action="store_true",
                        help="tokenize in memory, without the memory-mapped token cache")
    add_log_level(parser)
    # Also after the command; SUPPRESS keeps a value given before it (see build_parser).
    parser.add_argument("--local_rank", "--local-rank", type=int, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    add_launch_options(parser)


def _kinds_metrics() -> str:
    """'single-label: accuracy, ...; multi-label: ...': each kind's metrics, for eval's help."""
    return "; ".join(f"{k.name.replace('_', '-')}: {k.metrics_described}" for k in KINDS.values())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nlptrain", description="Fine-tune transformer text classifiers, one process or "
        "many (torchrun -m nlptrain ... for DDP).", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    # torch.distributed.launch (without --use-env) and the deepspeed launcher put --local_rank=N
    # right after the program, before the command.
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"nlptrain {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    train = commands.add_parser("train", help="fine-tune a model on a task",
                                description="Fine-tune a model on a task; the run directory "
                                "gets config.json, metrics.jsonl, checkpoints/, model/ (and best/, with a "
                                "validation set).",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(train)
    train.add_argument("--output-dir", help="run directory (default: runs/<task>-<time>)")
    resume_or_replace = train.add_mutually_exclusive_group()  # (together: --overwrite was unheeded)
    resume_or_replace.add_argument(
        "--resume", action="store_true", help="continue the run in --output-dir from its latest "
        "checkpoint, with its own options; those given with it (--epochs, --lr, ...) apply from there")
    resume_or_replace.add_argument(
        "--overwrite", action="store_true",
        help="replace the run --output-dir holds (never a folder of other files)")
    train.add_argument("--callback", action="append", default=[], metavar="MODULE:CLASS",
                       help="add a callback of yours, made with no arguments: a module path "
                       "(mypkg.callbacks:Notify) or a file (my_callbacks.py:Notify); repeatable "
                       "(a --resume gives them again: it loads no code by itself)")
    train.add_argument("--tensorboard", action=argparse.BooleanOptionalAction,
                       help="also log to RUN_DIR/tensorboard (needs: pip install tensorboard); a "
                       "--resume of a run that logged there goes on unless --no-tensorboard")
    train.add_argument("--progress-every", type=positive_seconds, default=30.0, metavar="SECONDS",
                       help="when stderr is not a terminal (a log file), one progress line this "
                            "often instead of a progress bar (default: 30)")
    add_task_options(train)
    train.set_defaults(handler=cmd_train, check_before_launch=check_train)

    evaluate = commands.add_parser("eval", help="score a saved model on a task's data",
                                   description="The task kind's metrics of a saved model "
                                   f"({_kinds_metrics()}); the same numbers with 1 or N processes.")
    add_run_options(evaluate)
    evaluate.add_argument("--model", required=True, help="a saved model folder (run's model/)")
    evaluate.add_argument("--split", default="test", choices=["test", "valid", "train"],
                          help="which set of the task to score (default: test)")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    # The task keys an evaluation most often changes, as train spells them (others: --set).
    evaluate.add_argument("--test-file", dest="set:data.test", metavar="FILE",
                          help="score this file as the test set (a file here, else in the task's data "
                          "folder): --set data.test=FILE")
    evaluate.add_argument("--threshold", dest="set:data.threshold", metavar="FLOAT",
                          help="multi-label: score at this threshold (default: the task's)")
    for key in ("text_column", "text_pair_column", "label_column"):  # as train: errors name them
        evaluate.add_argument("--" + key.replace("_", "-"), dest=f"set:data.{key}", metavar="COLUMN",
                              help=f"[data] {key}: name or 0-based index (default: the task's)")
    evaluate.add_argument("--precision", dest="set:train.precision", choices=["auto", "fp32", "bf16", "fp16"],
                          help="auto | fp32 | bf16 | fp16 (autocast; default: the task's, auto: the "
                          "precision the model was trained in, fp32 where this CPU runs that far "
                          "slower): --set train.precision=...")
    evaluate.add_argument("--cache-dir", dest="set:data.cache_dir", metavar="DIR",
                          help="token cache folder (default: the task's, else next to the data "
                          "if writable, else ~/.cache/nlptrain)")
    # How to read a file, which the readers' errors name as train's options.
    add_task_options(evaluate, only=[("data", key) for key in ("format", "header", "quoted")])
    evaluate.set_defaults(handler=cmd_eval, check_before_launch=check_eval)
    for module in MORE_COMMANDS:
        importlib.import_module(module).add_command(commands)
    parser.set_defaults(commands=commands.choices)  # for a misspelt option's own usage line
    return parser


def check_train(args: argparse.Namespace) -> None:
    """Before `--nproc` starts workers: the task, that each `--callback` file exists (each
    worker loads it), and that a resume fits the run: a mistake is one error, not one a rank."""
    task = resolve_task(args)  # (per-rank files: the train file is never read, and may be gone)
    check_data_files(task, ("valid", "test") if task.data.train_shards else ("train", "valid", "test"))
    if task.data.train_shards:  # their manifest, for this many ranks (each rank said it)
        from nlptrain.data.split import Manifest

        folder, manifest = Manifest.of_task(task)
        manifest.check_world_size(args.nproc, folder)
    for spec in args.callback:
        check_file(spec)
    from nlptrain.resume_checks import check_resume, check_strategy_fits
    from nlptrain.runs import check_free

    if args.resume and args.output_dir:  # what the checkpoint cannot take (seed, model, ...)
        check_resume(Path(args.output_dir), task.to_dict())
        check_strategy_fits(Path(args.output_dir), task.to_dict()["train"], args.nproc)
    if args.output_dir:  # a refusal said once, and not restarted
        check_free(Path(args.output_dir), run_allowed=args.resume or args.overwrite)


def check_eval(args: argparse.Namespace) -> None:
    """Before `--nproc` starts workers: the task, and the file it scores."""
    check_test_file_is_scored(args)
    check_data_files(resolve_task(args), (args.split,))


def check_test_file_is_scored(args: argparse.Namespace) -> None:
    """`--test-file F --split valid` scored the valid set and never read F, unsaid."""
    test_file = getattr(args, "set:data.test", None)
    if test_file is not None and args.split != "test":
        raise ConfigError(f"--test-file {test_file} is scored as the test set, and --split "
                          f"{args.split} scores the task's {args.split} set instead: drop --split")


def check_data_files(task: Any, which: tuple[str, ...]) -> None:
    """That the task's `which` files are there, before `--nproc` starts workers (one machine, one
    file system): else every rank says the same missing file."""
    from nlptrain.config import file_spec
    from nlptrain.data import entry_files

    for name in which:  # ('lines' with no labels: eval takes the model's, its workers find them)
        spec = file_spec(task, name)
        if spec is not None and ("{label}" not in spec.path or task.data.labels):
            entry_files(task, name)


def run_options(args: argparse.Namespace) -> Any:
    """The `train` options that are not part of the task, with the `--callback`s made."""
    from nlptrain import recipe
    try:  # each rank loads them: a file of this machine, the same mistake on each rank, said once
        callbacks = [make_callback(spec) for spec in args.callback]  # checked
    except ConfigError as err:
        raise every_local_rank(err) from None
    return recipe.RunOptions(output_dir=args.output_dir or "", resume=args.resume,
                             overwrite=args.overwrite, use_cache=not args.no_cache,
                             tensorboard=args.tensorboard, progress_every_s=args.progress_every,
                             callbacks=callbacks,
                             callback_specs=[absolute_spec(spec) for spec in args.callback])


def cmd_train(args: argparse.Namespace) -> int:
    import_libraries()
    from nlptrain import recipe

    environment = launch_environment(args)
    start_logging(args, environment.rank)  # before the task: its options' notes are logged
    task = resolve_task(args)
    opts = run_options(args)  # (after the logging: a callback module's logger takes its level)
    with recipe.backend(task.train.timeout, environment) as dist:
        recipe.train(task, opts, dist)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from nlptrain.scores import strict_json

    import_libraries()

    from nlptrain import eval_recipe, recipe
    from nlptrain.report import metrics_text

    environment = launch_environment(args)
    start_logging(args, environment.rank)
    check_test_file_is_scored(args)
    task = resolve_task(args)
    with recipe.backend(task.train.timeout, environment) as dist:
        metrics = eval_recipe.evaluate(task, args.model, args.split, dist, use_cache=not args.no_cache)
        if dist.is_main:
            print(json.dumps(strict_json(metrics), indent=1) if args.json else metrics_text(metrics))
    return 0


def start_logging(args: argparse.Namespace, rank: int) -> None:
    from nlptrain.logs import setup_logging

    setup_logging(rank, args.log_level)


def launch_environment(args: argparse.Namespace) -> Any:
    """Where this process stands in its job (nlptrain/environments.py); `--local_rank=N`, which
    torch.distributed.launch (without --use-env) and the deepspeed launcher pass, fills in a
    local rank the environment lacks."""
    from nlptrain.environments import detect

    return detect(local_rank=args.local_rank)


def _processes_to_resume_with(args: argparse.Namespace) -> int | None:
    """`train --resume` without --nproc, in one process (no launcher, or a one-task srun step as
    an interactive shell has), of a run that last ran on N processes started by `--nproc N`: N
    again (the run goes on as it ran), said. None otherwise: a torchrun or SLURM job of several
    ranks is launched again by its own launcher."""
    from nlptrain.environments import NlptrainLaunch, detect
    from nlptrain.run_record import last_launch

    if not args.output_dir or not detect().started_alone:
        return None
    processes, launcher = last_launch(Path(args.output_dir))
    if processes < 2 or launcher != NlptrainLaunch.name:
        return None
    print(f"resume: {processes} processes, as the run last ran (--nproc {processes}); give --nproc "
          "1 to go on in one", file=sys.stderr)
    return processes


def main(argv: list[str] | None = None) -> int:
    from nlptrain.launch import tell_launcher

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    # A native crash prints the Python stacks, to fd 2 (sys.stderr may be a capture without one).
    if not faulthandler.is_enabled() and sys.__stderr__ is not None:
        faulthandler.enable(sys.__stderr__, all_threads=True)
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    refuse_options_before_command(parser, argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        refuse_unknown(args.commands.get(args.command, parser), args.command, unknown)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "resume", False) and args.nproc is None:
            args.nproc = _processes_to_resume_with(args)
        if getattr(args, "max_restarts", 0) and args.nproc is None:  # else ignored, unsaid
            raise ConfigError(f"--max-restarts {args.max_restarts} restarts the workers --nproc N "
                              "starts: give --nproc (under torchrun: torchrun's --max-restarts)")
        if getattr(args, "nproc", None) is not None:  # --nproc 0 is refused, not ignored
            from nlptrain.launch import start_workers

            check = getattr(args, "check_before_launch", resolve_task)  # predict: its files
            code = start_workers(args, argv, lambda: check(args))
            if code is not None:
                return code
        from nlptrain.signals import interrupt_on_signals

        # A preemption outside the steps: a Ctrl-C, said (command_end.said_interrupt).
        with interrupt_on_signals(by_launcher=command_end.under_agent()):
            code = args.handler(args)
        return flush_stdout() or code
    except RemoteRankError as err:  # the failing rank reports; this one only says why it ends
        return command_end.said_peer_error(err)
    except NlptrainError as err:
        return command_end.said_error(err)
    except RuntimeError as err:  # a timeout or another rank's failure, said; else a traceback
        code = command_end.said_runtime_error(err)
        if code is None:
            raise
        return code
    except BrokenPipeError:  # `predict ... | head`: the reader has all it wanted; no traceback
        return command_end.said_closed_pipe()
    except SystemExit as ended:  # sys.exit(n) in a user's code: told, unless it was already
        tell_exit(ended)
        raise
    except KeyboardInterrupt as stop:  # train: a second Ctrl-C (the first finishes the step and
        return command_end.said_interrupt(args, stop)  # checkpoints), or one before training
    except Exception:
        tell_launcher(None)
        raise


if __name__ == "__main__":
    sys.exit(main())
