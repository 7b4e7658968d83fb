"""What a resume may change, checked against the run's record (config.json) before anything
is read or written: the task's data and model, the optimizer's parameter groups, the metric
that picks the best model, and whole checkpoints for the strategy."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from nlptrain.config import TrainConfig, data_order_harm, data_order_keys
from nlptrain.errors import CheckpointError, ConfigError, NlptrainError
from nlptrain.integrity import no_whole_checkpoint, pick_checkpoint, step_folders, whole_weights_refusal
from nlptrain.run_record import CONFIG_FILE, read_config, recorded_task_dict
from nlptrain.task_files import task_from_dict

log = logging.getLogger(__name__)


def check_resume(folder: Path, task: dict[str, Any], saved: dict[str, Any] | None = None) -> None:
    """Refuse a resume of the run in `folder` (its config.json: `saved`) with `task` where the
    checkpoint would not fit; also called before `--nproc` starts workers, so that the error is
    said once. Training options (epochs, cadences, lr, ...) may change; data and model may not."""
    saved = saved if saved is not None else read_config(folder)
    if saved is None:
        return
    # Where the token cache lives changes no row: a resume may read it from elsewhere.
    was = recorded_task_dict(saved)
    was = {**was, "data": {**was.get("data", {}), "cache_dir": None}}
    given, task = task, {**task, "data": {**task["data"], "cache_dir": None}}
    changed = [k for k in ("name", "data", "model") if task[k] != was.get(k)]
    if changed:
        what = [f"[{k}] {key} {was[k].get(key)!r} -> {value!r}" for k in changed if k != "name"
                and isinstance(was.get(k), dict) for key, value in task[k].items()
                if value != was[k].get(key)] or [f"task {was.get('name')!r} -> {task['name']!r}"]
        raise ConfigError(f"{folder}: holds a run with another {' and '.join(changed)} "
                          f"({', '.join(what)}); resume with the same task, or pick another "
                          "--output-dir")
    check_optimizer_kept(folder, task["train"], saved["task"].get("train", {}))
    check_best_metric_kept(folder, task, saved["task"])
    check_data_kept(folder, given, was.get("data_dir") or "", saved.get("data_digests"))
    check_a_checkpoint_is_left(folder)


def check_a_checkpoint_is_left(folder: Path) -> None:
    """Refuse to resume a run that finished and has no checkpoint left (checkpoints/ removed, as
    the run's closing line says it may be): it began again from the pre-trained weights and
    replaced the run's results, model and record. A run that died before its first checkpoint
    has no results: it starts afresh."""
    finished = (folder / "results.json").is_file() or (folder / "model").is_dir()
    if finished and not step_folders(folder / "checkpoints"):
        raise ConfigError(f"{folder}: holds a finished run and no checkpoint to go on from "
                          "(checkpoints/ is gone or empty), so a resume would train it again "
                          "from the start over its results; to do that, --overwrite; to keep "
                          "them, another --output-dir")


def data_digests(task: dict[str, Any], source: str) -> dict[str, str]:
    """The digest of each data entry's files as the run reads them now (an entry not there is
    left out: its own error comes with the read), recorded in config.json for its resumes."""
    found = {}
    # Per-rank files are left to their own check (their manifest's checksums, by part): split
    # again, they resume at an epoch's start, and mid-epoch is refused with its reason.
    for path, files_in in _entry_files(task, source, shards=False).items():
        try:
            found[path] = _digest_of(files_in(task.get("data_dir") or ""))
        except (NlptrainError, OSError):
            continue
    return found


def _digest_of(files: list[Path]) -> str:
    """`file_digest` of `files`, read once a process while they are unchanged (size, mtime): a
    resume checks its data where config.json is written and again where the run begins."""
    return _digest_while_unchanged(tuple((str(f), *_stamp(f)) for f in files))


def _stamp(path: Path) -> tuple[int, int]:
    stat = Path(path).stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=64)
def _digest_while_unchanged(stamped: tuple[tuple[str, int, int], ...]) -> str:
    from nlptrain.data.tokenized import file_digest

    return file_digest([Path(name) for name, _, _ in stamped])


def _entry_files(task: dict[str, Any], source: str, shards: bool = True) -> dict[str, Any]:
    """Each data entry's path -> a function of a data folder giving its files."""
    from nlptrain.config import FILES, file_spec
    from nlptrain.data import entry_files
    from nlptrain.data.split import MANIFEST

    parsed = task_from_dict({**task, "data_dir": ""}, source)
    # Per-rank files replace the train file (not read): their manifest holds each one's checksum.
    read = [which for which in FILES if not (which == "train" and parsed.data.train_shards)]
    named = {spec.path: lambda base, which=which: entry_files(parsed, which, base)
             for which in read if (spec := file_spec(parsed, which)) is not None}
    if parsed.data.train_shards and shards:
        named[parsed.data.train_shards] = lambda base: [Path(base) / parsed.data.train_shards / MANIFEST]
    return named


def check_data_kept(folder: Path, task: dict[str, Any], was_dir: str,
                    recorded: dict[str, str] | None = None) -> None:
    """A resume may change no data: each file's bytes as the run recorded them (`recorded`, its
    config.json's), wherever the data folder now is. A run recorded before digests were: files
    read from another folder are compared with those of the run's folder, if it is still there."""
    from nlptrain.data.tokenized import file_digest

    now_dir = task.get("data_dir") or ""
    if recorded:
        now = data_digests(task, str(folder / CONFIG_FILE))
        changed = [path for path, digest in recorded.items() if now.get(path, digest) != digest]
        if changed:  # (edited in place: the split drew other held-out rows, trained ones among them)
            raise ConfigError(f"{folder}: {changed[0]} in {now_dir or '.'} is not the data the run "
                              "read (its bytes have changed since); a resume may change no data: "
                              "put the file back as it was, or start a new run (--overwrite, or "
                              "another --output-dir)")
        return
    if not was_dir or Path(now_dir).resolve() == Path(was_dir).resolve():
        return
    if not Path(was_dir).is_dir():
        log.warning("%s: the run read its data in %s, which is gone; going on with the files of "
                    "the same names in %s (not compared)", folder, was_dir, now_dir)
        return
    for path, files_in in _entry_files(task, str(folder / CONFIG_FILE)).items():
        try:
            now = file_digest(files_in(now_dir))
        except (NlptrainError, OSError):  # not there: its own error comes with the read
            continue
        try:
            same = file_digest(files_in(was_dir)) == now
        except (NlptrainError, OSError):
            log.warning("%s: the run read %s in %s, which no longer holds it; going on with the "
                        "one in %s (not compared)", folder, path, was_dir, now_dir)
            continue
        if not same:
            raise ConfigError(f"{folder}: --data-dir {now_dir}: its {path} is not the data the "
                              f"run read ({Path(was_dir) / path}); a resume may change no data: "
                              f"resume with --data-dir {was_dir}, or start a new run")


def check_a_checkpoint_is_whole(folder: Path) -> None:
    """Refuse a resume whose checkpoints are all damaged before config.json records it (the
    trainer would refuse it after; the checksums are read once, `verify_checkpoint`)."""
    candidates = step_folders(folder)
    chosen, problems = pick_checkpoint(candidates)
    if candidates and chosen is None:
        for problem in problems:
            log.warning("%s: checkpoint skipped", problem)
        raise CheckpointError(no_whole_checkpoint(folder, problems))


def check_strategy_fits(folder: Path, train: dict[str, Any], world_size: int) -> None:
    """Refuse a resume under FSDP2 (fsdp on several processes) of a run whose newest checkpoint
    holds whole weights, before anything is written: else the refused strategy would stay in
    config.json, and the next plain --resume would be refused too."""
    if train.get("strategy") != "fsdp" or world_size == 1:
        return
    newest, _ = pick_checkpoint(step_folders(folder / "checkpoints"))  # the one a resume takes
    if newest is not None:
        refusal = whole_weights_refusal(newest, world_size)
        if refusal is not None:
            raise CheckpointError(refusal)


def changed_settings(before: dict[str, Any], after: dict[str, Any],
                     keys: tuple[str, ...] | None = None) -> list[str]:
    """'key old -> new' for each [train] setting (of `keys`, default all) that differs; a key the
    run's record predates had its default."""
    defaults = TrainConfig()
    return [f"{key} {before.get(key, getattr(defaults, key, None))!r} -> {value!r}"
            for key, value in after.items() if (keys is None or key in keys)
            and value != before.get(key, getattr(defaults, key, None))]


# The checkpoint's optimizer state is per parameter group: under other groups it cannot load.
# (lr, scale_lr, weight_decay and the schedule may change: the resume goes on with them.)
PARAM_GROUP_KEYS = ("layer_lr_decay",)


def check_optimizer_kept(folder: Path, train: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse a resume whose parameter groups or data order differ from the run's."""
    for keys, what in ((PARAM_GROUP_KEYS, "optimizer parameter groups"),
                       (data_order_keys(train.get("max_tokens", 0)), "data order")):
        changed = changed_settings(saved, train, keys)
        if changed:
            harm = ("" if what != "data order" else
                    f" ({data_order_harm([change.split(' ', 1)[0] for change in changed])})")
            raise ConfigError(f"{folder}: a resume keeps the run's {what}, and these changed: "
                              f"{', '.join(changed)}{harm}; resume with the run's values, or "
                              "start a new run (another --output-dir) to change them")


def check_best_metric_kept(folder: Path, task: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse a resume that picks the best model by another metric: the checkpoint's best score
    is the old metric's, and the new one's would be compared with it (a loss with an accuracy)."""
    from nlptrain.kinds import from_run_config

    def metric(of: dict[str, Any]) -> str:
        train = of.get("train", {})
        name = train.get("metric_for_best") or from_run_config({"task": of}).default_metric
        best_is = train.get("best_is", "auto")
        return name if best_is == "auto" else f"{name} ({best_is} is better)"

    if metric(task) != metric(saved):
        raise ConfigError(f"{folder}: a resume keeps the run's metric_for_best and best_is "
                          f"({metric(saved)!r} -> {metric(task)!r}): the best model so far was "
                          "picked by it; resume with it, or start a new run (another "
                          "--output-dir) to change it")
