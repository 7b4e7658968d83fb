"""predict's output: one row per input text (the input's kept columns, the prediction, the text)
as TSV or JSON lines, to a file written whole or to stdout."""

from __future__ import annotations

import datetime
import decimal
import fcntl
import json
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from nlptrain.durable import open_durably
from nlptrain.errors import ConfigError, NlptrainError
from nlptrain.kinds import SingleLabel, TaskKind

log = logging.getLogger("nlptrain")


OUTPUT_FORMATS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def output_format(output: str | None, chosen: str | None) -> str:
    if chosen:
        return chosen
    if not output or output == "-":
        return "tsv"
    suffix = Path(output).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ConfigError(f"{output}: cannot tell the output format from '{suffix}'; name the "
                          "file .tsv or .jsonl, or pass --format tsv|jsonl")
    return OUTPUT_FORMATS[suffix]


def check_output(output: str | None, input_file: str | None = None) -> None:
    """Refuse an output path that cannot be written before any text is scored (else the error
    comes as a traceback after the whole input was scored), or that is the input itself (which
    the predictions would replace); makes its folder."""
    if not output or output == "-":
        return
    path = Path(output)
    descriptor = open_descriptor(output)
    if input_file and _same_file(descriptor if descriptor is not None else path, input_file):
        raise ConfigError(f"{output}: --output is the input file; the predictions would replace "
                          "its texts. Give another file")
    if descriptor is not None:  # written as it is open (`>>`, a pipe): nothing to make
        _check_writable(output, descriptor)
        return
    if path.is_dir():
        raise ConfigError(f"{output}: --output is a folder; give a file, e.g. {path / 'predictions.tsv'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{output}: cannot make its folder ({err.strerror})") from None
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(f"{output}: its folder {path.parent} is not writable")


PREDICTED_NUMBERS = ("probability", "label_probabilities", "score")  # the kinds' (`predicted`)


def rows_of(texts: Any, outputs: Any, names: list[str], all_probs: bool,
            kind: TaskKind | None = None) -> Iterable[dict]:
    """One dict per text, in input order: row (from 1), line (where the text is in the input file:
    blank lines are skipped, a header counts), the input's kept columns (one named like an
    output column as input_<name>), the prediction (single-label: label and its probability;
    multi-label: every label over the threshold and its probability; regression: the score),
    [every label's probability], the text [and its pair].
    `texts`: an `Examples` (texts, pairs, kept columns) or a list of texts."""
    kind = kind or SingleLabel()
    pairs, lines = getattr(texts, "pairs", None), getattr(texts, "lines", None)
    kept = getattr(texts, "kept", None)
    for i, (text, p) in enumerate(zip(getattr(texts, "texts", texts), outputs, strict=True)):
        predicted = kind.predicted(p, names)
        # Any kind's numbers too: a kept "score" is not taken for (nor written as) a prediction.
        taken = {"row", "line", "probabilities", "text", "text_pair", *PREDICTED_NUMBERS, *predicted,
                 *(f"p_{name}" for name in names)}  # (--all-probs' columns in a TSV)
        row: dict[str, Any] = {"row": i + 1, **({"line": lines[i]} if lines else {})}
        if kept:
            row.update({name: kept[i][k] for k, name in kept_names(list(kept[i]), taken).items()})
        row.update(predicted)
        if all_probs and kind.has_classes:
            row["probabilities"] = {name: float(v) for name, v in zip(names, p, strict=True)}
        row["text"] = text
        if pairs is not None:
            row["text_pair"] = pairs[i]
        yield row


def kept_names(keys: list[str], taken: set[str]) -> dict[str, str]:
    """Each kept column's output name: its own, or input_<name> where an output has that name
    (input_input_<name> where a kept column is input_<name> already, as in predict's own output)."""
    used = taken | {k for k in keys if k not in taken}
    names = {}
    for key in keys:
        name = key
        while name in taken or (name != key and name in used):
            name = f"input_{name}"
        used.add(name)
        names[key] = name
    return names


def plain(value: Any) -> Any:
    """A kept cell as JSON can hold it: a Parquet decimal as its digits, a date or time in ISO
    8601, a binary cell as its text (json.dumps refused them after the whole input was scored),
    a NaN or infinity as null (as results.json writes it; NaN is no JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def write_rows(rows: Iterable[dict], handle: IO[str], fmt: str, names: list[str],
               all_probs: bool) -> None:
    if fmt == "jsonl":
        for row in rows:
            handle.write(json.dumps(plain(row), ensure_ascii=False, allow_nan=False) + "\n")
        return
    # TSV without quoting, like the readers: tabs and line breaks inside a text become spaces;
    # a list (multi-label) is one cell, its items joined by commas.
    clean = str.maketrans({"\t": " ", "\n": " ", "\r": " "})

    def cell(value: Any, key: str = "") -> str:
        if isinstance(value, list):
            return ",".join(cell(v, key) for v in value)
        if isinstance(value, float) and key in PREDICTED_NUMBERS:
            return f"{value:.6f}"
        # The input's own (kept) values as given, to join the output on: an id 1234567.891 stays
        # so, a JSON null is an empty cell, true and {"a": 1} are written as JSON writes them.
        value = plain(value)
        if value is None:  # (a NaN too)
            return ""
        if isinstance(value, bool | dict):
            return json.dumps(value, ensure_ascii=False).translate(clean)
        return str(value).translate(clean)

    head: list[str] | None = None  # the prediction's columns; then p_<label>s; then the texts
    texts = ("text", "text_pair")
    for row in rows:
        if head is None:
            head = [k for k in row if k not in ("probabilities", *texts)]
            probs = [f"p_{n}" for n in names] if "probabilities" in row else []
            handle.write("\t".join([*head, *probs, *(k for k in texts if k in row)]) + "\n")
        cells = [cell(row[k], k) for k in head]
        cells += [f"{row['probabilities'][n]:.6f}" for n in names] if "probabilities" in row else []
        handle.write("\t".join([*cells, *(cell(row[k]) for k in texts if k in row)]) + "\n")


def _same_file(output: int | Path, input_file: str) -> bool:
    """Whether the output (a path, or a descriptor: `--output /dev/stdout >> INPUT`) is the input."""
    try:
        there = os.fstat(output) if isinstance(output, int) else os.stat(output)
        return os.path.samestat(there, os.stat(input_file))
    except OSError:  # (a new file, stdin as input: not the same)
        return False


def check_reaches_workers(output: str | None, workers: str, or_else: str = "") -> None:
    """A launcher's workers get the shell's stdout and stderr, and no other descriptor of it
    (torch's agent starts them with close_fds): a worker wrote into a descriptor of its own of
    that number, or failed after scoring every text."""
    descriptor = open_descriptor(output or "")
    if descriptor is not None and descriptor > 2:
        raise ConfigError(f"--output {output}: descriptor {descriptor} does not reach {workers}, "
                          f"which write the predictions (they get stdout and stderr only): give a "
                          f"file's path{or_else}")


def _check_writable(output: str, descriptor: int) -> None:
    """A descriptor named by --output must be open, and for writing (`9>file`, not `9<file`)."""
    try:
        mode = fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise ConfigError(f"{output}: no descriptor {descriptor} is open in this process; open it "
                          f"for writing (`{descriptor}>FILE`) or give a file's path") from None
    if mode == os.O_RDONLY:
        raise ConfigError(f"{output}: descriptor {descriptor} is open for reading only; open it "
                          f"for writing (`{descriptor}>FILE`) or give a file's path")


def open_descriptor(output: str) -> int | None:
    """The descriptor `output` names where it is one of this process's (/dev/stdout, /dev/fd/N,
    /proc/self/fd/N): resolved, it was a pipe's name no file can be made at, or under `>>` the
    file, which a new file then replaced with what it held before lost."""
    named = {"/dev/stdout": 1, "/dev/stderr": 2}
    if output in named:
        return named[output]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if output.startswith(prefix) and output[len(prefix):].isdigit():
            return int(output[len(prefix):])
    return None


def write_output(rows: Iterable[dict], output: str | None, fmt: str, names: list[str],
                 all_probs: bool) -> None:
    """To stdout, or to the file `output`, replaced whole (never half a file); a link's target
    is the file replaced, and a device or a pipe (/dev/null, a fifo), or a descriptor of this
    process (/dev/stdout), is written to as it is."""
    to_stdout = not output or output == "-"
    try:
        if to_stdout:
            write_rows(rows, sys.stdout, fmt, names, all_probs)
            sys.stdout.flush()
            return
        descriptor = open_descriptor(output)
        if descriptor is not None:  # /dev/stdout under a pipe or `>>`: the stream as it is open
            sys.stdout.flush()
            with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n", closefd=False) as handle:
                write_rows(rows, handle, fmt, names, all_probs)
            return
        path = Path(output).resolve()
        durably = not path.exists() or path.is_file()
        with (open_durably if durably else open)(path, "w", encoding="utf-8", newline="\n") as handle:
            write_rows(rows, handle, fmt, names, all_probs)
    except BrokenPipeError:  # `predict ... | head`: the reader has what it wanted (cli.main)
        from nlptrain.launch import STDOUT_CLOSED, tell_launcher

        tell_launcher(f"{STDOUT_CLOSED}: the reader has what it wanted")
        raise
    except OSError as err:
        raise NlptrainError(f"{'stdout' if to_stdout else output}: the predictions cannot be "
                            f"written ({err.strerror or err})") from None
    log.info("%s: predictions written", output)

