"""Command line: `python -m nlptrain {train,eval,...}`, the same under `torchrun -m nlptrain`.

Every key of [data], [model] and [train] but labels is also an option of `train` (`--lr 3e-5`,
`--max-length 64`, ...), generated from the dataclasses in config.py so `--help` lists them with
their meaning; `--set section.key=value` reaches every key.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import importlib
import importlib.util
import logging
import os
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

from nlptrain.config import SECTIONS, TaskConfig, apply_override, load_task, validate
from nlptrain.errors import ConfigError, NlptrainError, RemoteRankError
from nlptrain.logs import add_log_level

log = logging.getLogger("nlptrain")

# Options whose names would be unclear or clash as plain `--<key>`.
FLAG_NAMES = {("data", "train"): "--train-file", ("data", "valid"): "--valid-file",
              ("data", "test"): "--test-file", ("data", "format"): "--data-format"}
NOT_ON_COMMAND_LINE = {("data", "labels")}  # a list or table: set it in the task file
SOURCE = "<options>"  # where validate() names the source, filled in with the options at fault
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


def tasks_dir() -> Path:
    import nlptrain.tasks

    return Path(nlptrain.tasks.__file__).parent


def find_task(name: str) -> Path:
    """A task file path, or the name of a file in tasks/ (with or without .toml)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = tasks_dir() / f"{name.removesuffix('.toml')}.toml"
    if shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in tasks_dir().glob("*.toml")))
    raise ConfigError(f"{name}: no such task file, and not a shipped task ({known})")


def parse_value(text: str, hint: Any) -> Any:
    """A command-line value: a TOML literal (3e-5, true, [..]) unless the key is plain text."""
    if hint is str:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def flag_of(section: str, f: dataclasses.Field) -> str:
    """The option that sets task key `section.f`: `--max-length`, `--train-file`, `--model`."""
    return FLAG_NAMES.get((section, f.name)) or f.metadata.get("flag") or \
        "--" + f.name.replace("_", "-")


def _task_options(parser: argparse.ArgumentParser) -> None:
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"[{section}] options (override the task file)")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if (section, f.name) in NOT_ON_COMMAND_LINE:
                continue
            flag = flag_of(section, f)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kwargs: dict[str, Any] = {"dest": f"set:{section}.{f.name}", "default": None,
                                      "help": f"{f.metadata['help']} (default: {default!r})"}
            if hints[f.name] is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["metavar"] = hints[f.name].__name__.upper() if isinstance(
                    hints[f.name], type) else "VALUE"
            group.add_argument(flag, **kwargs)


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
    parser.add_argument("--nproc", type=int, metavar="N",
                        help="start N processes on this machine (DDP; torch's elastic agent, as "
                        "torchrun): no launcher needed")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="with --nproc: restart all processes up to N times after a failure; "
                        "a restarted training resumes from its latest checkpoint (default: 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nlptrain", description="Fine-tune transformer text classifiers, one process or "
        "many (torchrun -m nlptrain ... for DDP).", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    # torch.distributed.launch (without --use-env) and the deepspeed launcher put --local_rank=N
    # right after the program, before the command.
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    train = commands.add_parser("train", help="fine-tune a model on a task",
                                description="Fine-tune a model on a task; the run directory "
                                "gets config.json, metrics.jsonl, checkpoints/, best/, model/.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(train)
    train.add_argument("--output-dir", help="run directory (default: runs/<task>-<time>)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --output-dir from its latest checkpoint")
    train.add_argument("--overwrite", action="store_true",
                       help="replace what --output-dir holds")
    train.add_argument("--callback", action="append", default=[], metavar="MODULE:CLASS",
                       help="add a callback of yours, made with no arguments: a module path "
                       "(mypkg.callbacks:Notify) or a file (my_callbacks.py:Notify); repeatable")
    train.add_argument("--tensorboard", action="store_true",
                       help="also log to RUN_DIR/tensorboard (needs: pip install tensorboard)")
    train.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                       help="when stderr is not a terminal (a log file), one progress line this "
                            "often instead of a progress bar (default: 30)")
    _task_options(train)
    train.set_defaults(handler=cmd_train)

    evaluate = commands.add_parser("eval", help="score a saved model on a task's data",
                                   description="The task kind's metrics of a saved model "
                                   "(single-label: accuracy, macro-F1, per-class precision/recall "
                                   "and the confusion matrix; multi-label: micro/macro-F1 and per "
                                   "label; regression: Pearson, Spearman, MSE, MAE); the same "
                                   "numbers with 1 or N processes.")
    add_run_options(evaluate)
    evaluate.add_argument("--model", required=True, help="a saved model folder (run's model/)")
    evaluate.add_argument("--split", default="test", choices=["test", "valid", "train"],
                          help="which set of the task to score (default: test)")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(handler=cmd_eval)
    for module in MORE_COMMANDS:
        importlib.import_module(module).add_command(commands)
    return parser


def load_object(spec: str) -> Any:
    """`package.module:Name` or `path/to/file.py:Name`."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--callback {spec}: expected MODULE:CLASS or FILE.py:CLASS")
    try:
        if where.endswith(".py"):
            path = Path(where)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or not path.is_file():
                raise ConfigError(f"--callback {spec}: file {where} not found")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        return getattr(module, name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--callback {spec}: cannot load it ({err})") from None


def resolve_task(args: argparse.Namespace) -> TaskConfig:
    """The task file named by --task, with the command line's overrides and data folder. A resume
    that names no task goes on with the run's own (its config.json), the overrides on top; so
    does `eval` of a run's model/ (the run's data, its held-out split)."""
    from nlptrain.runs import recorded_task

    resumed = args.task is None and getattr(args, "resume", False) and args.output_dir
    task = resumed and recorded_task(Path(args.output_dir))
    if args.task is None and getattr(args, "model", None) and args.command == "eval":
        task = recorded_task(Path(args.model).parent)
        if task:
            log.info("task %s: the run's own, from %s", task.name, Path(args.model).parent / "config.json")
    task = task or load_task(find_task(args.task or "default"))
    task = apply_overrides(task, args)
    data_dir = args.data_dir or task.data_dir or os.environ.get("NLPTRAIN_DATA_DIR", "")
    if not data_dir:
        raise ConfigError(f"task '{task.name}' needs its data folder: pass --data-dir DIR "
                          "(e.g. the folder holding rt-polarity/, sst-2/, trec/, ag-news/)")
    task.data_dir = str(Path(data_dir).resolve())
    return task


def apply_overrides(task: TaskConfig, args: argparse.Namespace) -> TaskConfig:
    """Options named after task keys (`--lr`, ...), then each `--set section.key=value`; checked
    together once all are set (an error names the options whose keys it is about)."""
    given: list[tuple[str, str]] = []  # (the option as given, "[section] key")
    for key, value in vars(args).items():
        if key.startswith("set:") and value is not None:
            section, name = key[4:].split(".")
            hint = typing.get_type_hints(SECTIONS[section])[name]
            flag = flag_of(section, {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name])
            given.append((flag, f"[{section}] {name}"))
            apply_override(task, key[4:], parse_value(value, hint) if isinstance(value, str)
                           else value, flag)
    for item in args.set:
        dotted, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected SECTION.KEY=VALUE")
        section, _, name = dotted.strip().partition(".")
        given.append((f"--set {item}", f"[{section}] {name}"))
        apply_override(task, dotted.strip(), parse_value(text.strip(), None), given[-1][0])
    if given:  # the task file alone was checked when it was read
        try:
            validate(task, SOURCE)
        except ConfigError as err:  # named: the options the message is about, else all given
            about = [flag for flag, key in given if key in str(err)] or [flag for flag, _ in given]
            raise ConfigError(str(err).replace(SOURCE, ", ".join(about), 1)) from None
    return task


def run_options(args: argparse.Namespace) -> Any:
    """The `train` options that are not part of the task, with the `--callback`s made."""
    from nlptrain import recipe
    from nlptrain.events import check_callback

    return recipe.RunOptions(output_dir=args.output_dir or "", resume=args.resume,
                             overwrite=args.overwrite, use_cache=not args.no_cache,
                             tensorboard=args.tensorboard, progress_every_s=args.progress_every,
                             callbacks=[check_callback(load_object(spec)())  # before the run dir
                                        for spec in args.callback])


def cmd_train(args: argparse.Namespace) -> int:
    from nlptrain import recipe

    task = resolve_task(args)
    opts = run_options(args)
    environment = launch_environment(args)
    start_logging(args, environment.rank)
    with recipe.backend(task.train.timeout, environment) as dist:
        recipe.train(task, opts, dist)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from nlptrain import recipe
    from nlptrain.report import metrics_text

    environment = launch_environment(args)
    start_logging(args, environment.rank)
    task = resolve_task(args)
    with recipe.backend(task.train.timeout, environment) as dist:
        metrics = recipe.evaluate(task, args.model, args.split, dist, use_cache=not args.no_cache)
        if dist.is_main:
            print(json.dumps(metrics, indent=1) if args.json else metrics_text(metrics))
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
    """`train --resume` without --nproc and without a launcher, of a run that last ran on N
    processes started by `--nproc N`: N again (the run goes on as it ran), said. None otherwise: a
    torchrun or SLURM job is launched again by its own launcher."""
    from nlptrain.environments import Local, NlptrainLaunch, detect
    from nlptrain.runs import last_launch

    if not args.output_dir or not isinstance(detect(), Local):
        return None
    processes, launcher = last_launch(Path(args.output_dir))
    if processes < 2 or launcher != NlptrainLaunch.name:
        return None
    print(f"resume: {processes} processes, as the run last ran (--nproc {processes}); give --nproc "
          "1 to go on in one", file=sys.stderr)
    return processes


def _rank_prefix() -> str:
    from nlptrain.environments import detect

    try:
        rank = detect().rank
    except (KeyError, ValueError, NlptrainError):  # (the error being reported, maybe)
        rank = 0
    return "" if rank == 0 else f"[rank {rank}] "


def main(argv: list[str] | None = None) -> int:
    from nlptrain.launch import tell_launcher

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    # A native crash prints the Python stacks, to fd 2 (sys.stderr may be a capture without one).
    if not faulthandler.is_enabled() and sys.__stderr__ is not None:
        faulthandler.enable(sys.__stderr__, all_threads=True)
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "resume", False) and args.nproc is None:
            args.nproc = _processes_to_resume_with(args)
        if getattr(args, "nproc", None) is not None:  # --nproc 0 is refused, not ignored
            from nlptrain.launch import start_workers

            code = start_workers(args, argv, lambda: resolve_task(args))
            if code is not None:
                return code
        return args.handler(args)
    except RemoteRankError as err:  # the failing rank reports; this one only says why it ends
        log.debug("%s", err)
        tell_launcher(f"stopped: {str(err).split(':')[0]} (see the root cause)", follows=True)
        return 1
    except NlptrainError as err:
        if err.raised_on_every_rank and _rank_prefix():
            tell_launcher("stopped with rank 0 (see the root cause)", follows=True)
        else:
            print(f"{_rank_prefix()}error: {err}", file=sys.stderr)
            tell_launcher(f"error: {err}")
        return err.exit_code
    except RuntimeError as err:
        from nlptrain.distributed import is_peer_failure, timeout_message

        message = timeout_message(err)  # no rank reported an error: this one is the first to know
        if message:
            print(f"{_rank_prefix()}error: {message}", file=sys.stderr)
            tell_launcher(f"error: {message}")
            return 1
        if not is_peer_failure(err):
            tell_launcher(None)
            raise
        print(f"{_rank_prefix()}stopping: another rank failed (see its error); "
              f"{str(err).splitlines()[0][:160]}", file=sys.stderr)
        tell_launcher("stopped: another rank failed (see its error)", follows=True)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C (the first finishes the step and checkpoints)
        print(f"{_rank_prefix()}interrupted: stopped at once, without waiting for the step under "
              "way; a run goes on from its last whole checkpoint with train --resume",
              file=sys.stderr)
        return 130
    except Exception:
        tell_launcher(None)
        raise


if __name__ == "__main__":
    sys.exit(main())
