"""A Trainer's arguments that Python would take wrong without a word, or fail on later with a
message about something else: a task kind's class for an instance, one function for a list of
metrics, a string for a list of label names (a list of its characters)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nlptrain.errors import ConfigError


def checked_kind(kind: Any) -> Any:
    if isinstance(kind, type):  # TaskKind.check() then lacked an argument
        raise ConfigError(f"kind={kind.__name__} is a class: pass an instance, "
                          f"kind={kind.__name__}()")
    return kind


def listed_metrics(metrics: Any) -> list[Any]:
    if callable(metrics) or not isinstance(metrics, Iterable):
        name = getattr(metrics, "__name__", type(metrics).__name__)
        raise ConfigError(f"metrics= takes a list of functions: metrics=[{name}]")
    return list(metrics)


def listed_label_names(names: Sequence[str] | None) -> list[str] | None:
    if isinstance(names, str):  # list("neg,pos") is 7 labels of one character
        raise ConfigError(f"label_names= takes a list of names, not the string {names!r}: "
                          f"label_names={[n.strip() for n in names.split(',')]}")
    return list(names) if names else None
