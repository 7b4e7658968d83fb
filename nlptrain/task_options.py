"""A task from the command line: the task file `--task` names (or a shipped one, or a run's
own), every key of [data], [model] and [train] as an option of its own (`--lr 3e-5`,
`--max-length 64`, generated from the dataclasses in config.py so `--help` lists them with their
meaning), `--set section.key=value`, and the data folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import tomllib
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

from nlptrain.config import SECTIONS, TaskConfig, file_spec
from nlptrain.errors import ConfigError, every_local_rank
from nlptrain.kinds import KINDS
from nlptrain.task_files import apply_override, load_task, validate

log = logging.getLogger("nlptrain")

# Options whose names would be unclear or clash as plain `--<key>`.
FLAG_NAMES = {("data", "train"): "--train-file", ("data", "valid"): "--valid-file",
              ("data", "test"): "--test-file", ("data", "format"): "--data-format"}
FILE_FLAGS = {("data", "train"), ("data", "valid"), ("data", "test")}  # else: in the data folder
NOT_ON_COMMAND_LINE = {("data", "labels")}  # a list or table: set it in the task file
SOURCE = "<options>"  # where validate() names the source, filled in with the options at fault

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
    """A command-line value: a TOML literal (3e-5, true, [..]; `1,2` as [1, 2], the way people
    type a list on a command line) unless the key is plain text."""
    if hint is str:
        return text
    for literal in (text, f"[{text}]") if "," in text and not text.startswith("[") else (text,):
        try:
            return tomllib.loads(f"v = {literal}")["v"]
        except tomllib.TOMLDecodeError:
            pass
    return text


def flag_of(section: str, f: dataclasses.Field) -> str:
    """The option that sets task key `section.f`: `--max-length`, `--train-file`, `--model`."""
    return FLAG_NAMES.get((section, f.name)) or f.metadata.get("flag") or \
        "--" + f.name.replace("_", "-")


def add_task_options(parser: argparse.ArgumentParser,
                     only: Collection[tuple[str, str]] | None = None) -> None:
    """An option for each task key (`only` those (section, key), where given), spelt as every
    command spells it: errors name these options."""
    for section, cls in SECTIONS.items():
        if only is not None and not any(s == section for s, _ in only):
            continue
        group = parser.add_argument_group(f"[{section}] options (override the task file)")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if (section, f.name) in NOT_ON_COMMAND_LINE or (only is not None and (section, f.name)
                                                             not in only):
                continue
            flag = flag_of(section, f)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kwargs: dict[str, Any] = {"dest": f"set:{section}.{f.name}", "default": None,
                                      "help": f"{f.metadata['help']} (default: the task's, "
                                              f"else {default!r})"}
            if hints[f.name] is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["metavar"] = hints[f.name].__name__.upper() if isinstance(
                    hints[f.name], type) else "VALUE"
            group.add_argument(flag, **kwargs)


def resolve_task(args: argparse.Namespace) -> TaskConfig:
    """The task file named by --task, with the command line's overrides and data folder. A resume
    that names no task goes on with the run's own (its config.json), the overrides on top; so
    does `eval` of a run's model/ (the run's data, its held-out split)."""
    from nlptrain.run_record import read_config, recorded_task

    resumed = args.task is None and getattr(args, "resume", False) and args.output_dir
    task = resumed and recorded_task(Path(args.output_dir))
    if resumed and not task:  # a mistyped folder: the default task would train, unasked
        raise ConfigError(f"--resume: no run in {args.output_dir} to go on with (no run's "
                          f"config.json); check the folder, or give --task to start one there")
    if args.task is None and getattr(args, "model", None) and args.command == "eval":
        task = recorded_task(Path(args.model).resolve().parent)  # (--model . from model/)
        if task:
            log.info("task %s: the run's own, from %s", task.name, Path(args.model).parent / "config.json")
        elif Path(args.model).is_dir() and read_config(Path(args.model)) is None:  # a model folder
            # copied out of its run: said, as the default task may fit by chance (no folder at
            # all, or a run's folder for its model/: their own error comes next)
            log.warning("no --task, and no run's config.json beside %s: scoring on the default "
                        "task; give --task for the model's own", args.model)
    task_file = None if task else find_task(args.task or "default")
    task = task or load_task(task_file)
    model_before = task.model.name
    task = apply_overrides(task, args)
    if task_file is not None or task.model.name != model_before:  # (not a run's recorded one)
        task.model.name = model_folder(task.model.name, task_file)
    data_dir = args.data_dir or task.data_dir or os.environ.get("NLPTRAIN_DATA_DIR", "")
    if not data_dir:
        own_file = args.task and Path(args.task).is_file()  # not a shipped task: its data is near it
        where = (f", or set data_dir = \".\" in {args.task} to read its paths from the file's "
                 "own folder" if own_file else
                 " (e.g. the folder holding rt-polarity/, sst-2/, trec/, ag-news/)")
        raise ConfigError(f"task '{task.name}' needs its data folder: pass --data-dir DIR{where}")
    read_there = [path for path in (*(getattr(file_spec(task, which), "path", "") for which in
                                      ("train", "valid", "test")), task.data.train_shards)
                  if path and not Path(path).is_absolute()]
    if read_there and not (args.data_dir or task.data_dir) and not Path(data_dir).is_dir():
        raise every_local_rank(ConfigError(  # (a missing file's own error advises --data-dir)
            f"NLPTRAIN_DATA_DIR={data_dir}: no such folder, and the task reads {read_there[0]} "
            "from it; set it to the folder that holds the tasks' data, or give --data-dir DIR"))
    task.data_dir = str(Path(data_dir).resolve())
    return task


def model_folder(name: str, task_file: Path | None) -> str:
    """A model folder given by a relative path, made absolute: where the user stands, else beside
    the task file (as its data_dir). config.json records it, and a resume from elsewhere finds it."""
    path = Path(name).expanduser()
    if path.is_absolute():
        return name
    for base in (Path.cwd(), Path(task_file).parent if task_file else None):
        if base is not None and (base / path / "config.json").is_file():
            return str((base / path).resolve())
    return name  # a short name (minilm), or a folder that is not there: its own error follows


def apply_overrides(task: TaskConfig, args: argparse.Namespace) -> TaskConfig:
    """Options named after task keys (`--lr`, ...), then each `--set section.key=value`; checked
    together once all are set (an error names the options whose keys it is about)."""
    given: list[tuple[str, str]] = []  # (the option as given, "[section] key")
    kind_before = task.data.kind
    for key, value in vars(args).items():
        if key.startswith("set:") and value is not None:
            section, name = key[4:].split(".")
            hint = typing.get_type_hints(SECTIONS[section])[name]
            flag = flag_of(section, {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name])
            given.append((flag, f"[{section}] {name}"))
            if (section, name) in FILE_FLAGS and Path(value).is_file():  # typed in a shell: the
                value = str(Path(value).resolve())  # file where the user stands is the one meant
            if (section, name) in FILE_FLAGS:
                _replacing_a_table(task, name, value, flag)
            apply_override(task, key[4:], parse_value(value, hint) if isinstance(value, str)
                           else value, flag)
    for item in args.set:
        dotted, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item}: expected SECTION.KEY=VALUE")
        section, _, name = dotted.strip().partition(".")
        key = f"[{section}] {name}" if name else section  # (a top-level key: name, data_dir)
        twice = [flag for flag, known in given if known == key]
        if twice:  # else the later one would win without a word
            raise ConfigError(f"{twice[0]} and --set {item} both set {key}; give one")
        given.append((f"--set {item}", key))
        apply_override(task, dotted.strip(), parse_value(text.strip(), None), given[-1][0])
    kind = KINDS.get(task.data.kind)  # (None: not a kind, which validate says)
    if kind is not None and not kind.has_classes and task.data.kind != kind_before and \
            task.data.labels and "[data] labels" not in (key for _, key in given):
        # The task's labels, for its classes: the kind it now is has none.
        log.info("[data] labels of task %s left out: a %s task has none", task.name, kind.name)
        task.data.labels = []
    if given:  # the task file alone was checked when it was read
        try:
            validate(task, SOURCE)
        except ConfigError as err:  # named: the options the message is about, else all given
            about = [flag for flag, key in given if re.search(rf"{re.escape(key)}(?!\w)", str(err))] \
                or [flag for flag, _ in given]  # ([data] valid is not [data] valid_size)
            raise ConfigError(str(err).replace(SOURCE, ", ".join(about), 1)) from None
    return task


def _replacing_a_table(task: TaskConfig, which: str, path: str, flag: str) -> None:
    """`--test-file F` where the task reads its test file by a table of its own (ag-news': no
    header, columns by number): F replaces the table, read by [data]'s keys, which is said with
    the way to keep the table's (the very file the task names failed, with no word why)."""
    table = getattr(task.data, which)
    keys = {key: value for key, value in table.items() if key != "path"} \
        if isinstance(table, dict) else {}
    if keys:
        log.info("%s %s replaces the task's [data] %s table (%s): it is read by [data]'s header "
                 "and columns; --set data.%s.path=%s reads it by the table's", flag, path, which,
                 ", ".join(f"{key} = {json.dumps(value)}" for key, value in keys.items()), which,
                 path)


def task_key_of(flag: str) -> tuple[str, str] | None:
    """(`section.key`, its value where the flag says it) of the task key `train` sets with
    `flag`: --max-length (model.max_length, ''), --no-group-by-length (train.group_by_length,
    'false')."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            said = flag_of(section, f)
            if f.type in (bool, "bool") and flag in (said, f"--no-{said[2:]}"):
                return f"{section}.{f.name}", "false" if flag.startswith("--no-") else "true"
            if flag == said:
                return f"{section}.{f.name}", ""
    return None
