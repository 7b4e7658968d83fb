"""A run's record, its config.json: the task as it last ran, how it was launched, what was
decided once it started. Read by a resume, an eval of the run's model, the report and model card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nlptrain.config import TaskConfig
from nlptrain.durable import write_text
from nlptrain.kinds import KINDS
from nlptrain.task_files import task_from_dict

CONFIG_FILE = "config.json"


def read_config(folder: Path) -> dict[str, Any] | None:
    """The record of the nlptrain run in `folder`, or None where it holds none: a config.json
    that is not a run's (a saved model's, an app's; not JSON) makes no run of the folder."""
    return record_and_why(folder / CONFIG_FILE)[0]


def record_and_why(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the run's record, or None; why a config.json there is none)."""
    if not path.is_file():
        return None, f"no {CONFIG_FILE}"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # (JSONDecodeError is a ValueError)
        return None, f"its {CONFIG_FILE} is not JSON: {err}"
    if not (isinstance(saved, dict) and isinstance(saved.get("task"), dict)
            and "world_size" in saved):  # what every run's record has held
        return None, f"its {CONFIG_FILE} is not a run's record"
    return saved, ""


def recorded_task(folder: Path) -> TaskConfig | None:
    """The task of the run in `folder` as it last ran (its config.json: the task file with the
    command line's options applied), or None where there is no run: a resume that names no task
    goes on with it, instead of the default task's settings."""
    saved = read_config(folder)
    return None if saved is None else task_from_dict(recorded_task_dict(saved),
                                                     str(folder / CONFIG_FILE))


def recorded_task_dict(saved: dict[str, Any]) -> dict[str, Any]:
    """The task a run's config.json holds. A regression run (a kind without classes) recorded
    before labels on regression were refused may hold the labels its training left out: left
    out here too, so it resumes."""
    data = saved["task"].get("data", {})
    named = data.get("kind")
    kind = KINDS.get(named) if isinstance(named, str) else None  # (a wrong type: task_from_dict says)
    if kind is not None and not kind.has_classes and data.get("labels"):
        return {**saved["task"], "data": {**data, "labels": []}}
    return saved["task"]


def last_launch(folder: Path) -> tuple[int, str | None]:
    """(processes, launcher name) of the run in `folder` as it last ran; (1, None) for none."""
    saved = read_config(folder) or {}
    last = (saved.get("resumes") or [saved])[-1]
    launcher = last.get("launcher") if "resumes" in saved else (saved.get("launch") or {}).get("launcher")
    return int(last.get("world_size", 1)), launcher


def keep_reached_epochs(folder: Path, reached: int) -> None:
    """A resume asking for fewer epochs than the run had `reached` trains nothing: config.json,
    and the report and model card made from it, keep the epochs the run was set to (or reached,
    if more), not the fewer asked (a run of 8 epochs said 3)."""
    record = read_config(folder) or {}
    before = (record.get("resumes") or [{}])[-1].get("epochs_before") or 0
    record["task"]["train"]["epochs"] = max(reached, before)
    write_text(folder / CONFIG_FILE, json.dumps(record, indent=2))


def record_in_config(folder: Path, key: str, value: Any) -> None:
    """Add what was decided once the run started (e.g. the precision "auto" chose) to its
    config.json."""
    record = read_config(folder) or {}
    record[key] = value
    write_text(folder / CONFIG_FILE, json.dumps(record, indent=2))
