"""`python -m nlptrain predict`: label and probability for each text of a file.

Input: TSV/CSV (text in column `--text-column`; header and quoting as the model's run read its
training file, unless given), JSONL objects, Parquet, or plain text, one per line. Output: TSV
or JSONL, to a file or stdout, one row per input text in input order, scored in the precision
the model was trained in.
Under torchrun each rank scores a share (`evaluate.predict`), the shares are gathered back in
row order, and rank 0 alone writes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

from nlptrain.errors import ConfigError, NlptrainError
from nlptrain.kinds import TaskKind, from_model_config
from nlptrain.launch import add_launch_options
from nlptrain.logs import add_log_level
from nlptrain.models import usable_positions
from nlptrain.option_types import positive_int, positive_seconds, probability
from nlptrain.predict_output import check_output, check_reaches_workers, output_format, rows_of, write_output
from nlptrain.startup import import_libraries

if TYPE_CHECKING:  # torch is imported when a command runs, not for --help
    from nlptrain.distributed import Backend

log = logging.getLogger("nlptrain")


def default_max_length(model_dir: Path, tokenizer: Any, model: Any) -> int:
    """The run's own max_length when the model sits in a run directory, else what fits the model
    (`model`: a model or its config)."""
    run_config = model_dir.parent / "config.json"
    if run_config.is_file():
        try:
            return int(json.loads(run_config.read_text())["task"]["model"]["max_length"])
        except (KeyError, TypeError, ValueError, json.JSONDecodeError):
            pass  # not a run's config.json: fall through
    trained = getattr(getattr(model, "config", model), "nlptrain_max_length", None)
    if trained:  # the export of a run from the Python API: no run folder around it
        return int(trained)
    limits = [usable_positions(model), tokenizer.model_max_length, 512]
    return min(int(n) for n in limits if isinstance(n, int) and n > 0)


@contextmanager
def readable_input(name: str) -> Iterator[Path]:
    """`--input` as a file the readers can open more than once: standard input (`-`) or a pipe
    (/dev/stdin, a shell's <(...)) is copied to a temporary file first (read as lines unless
    --input-format says otherwise)."""
    path = Path(name)
    if name != "-" and (not path.exists() or path.is_file() or path.is_dir()):
        yield path  # (a missing file or a folder: the reader says so)
        return
    with tempfile.TemporaryDirectory(prefix="nlptrain-input-") as folder:
        copy = Path(folder) / ("stdin" if name == "-" else path.name)
        with open(copy, "wb") as out:
            if name == "-":
                shutil.copyfileobj(sys.stdin.buffer, out)
            else:
                with open(path, "rb") as source:
                    shutil.copyfileobj(source, out)
        try:
            yield copy
        except NlptrainError as err:  # name what the user gave, not a copy gone once we exit
            err.args = (str(err).replace(str(copy), "stdin" if name == "-" else name),)
            raise


def saved_model_config(model: str) -> dict[str, Any]:
    """The model folder's config.json as saved ({} where it cannot be read: the model's loading
    says why)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def check_model_kind(args: argparse.Namespace) -> None:
    """The model's kind (one not registered here), and `--threshold` for a kind that has none,
    refused from its config.json before any input is read or worker started (one error, not
    one a rank)."""
    config = saved_model_config(args.model)
    if not config:
        return
    # transformers' num_labels is id2label's length (one output, no problem_type: a regression)
    outputs = len(config.get("id2label") or {}) or 2
    kind = from_model_config(SimpleNamespace(**{"num_labels": outputs, **config}))
    if args.threshold is not None and "threshold" not in kind.settings:
        raise ConfigError(f"--threshold {args.threshold:g}: {args.model} is a {kind.name} model, "
                          "which predicts without a threshold (a multi_label model has one)")


def at_threshold(trained: TaskKind, threshold: float | None) -> TaskKind:
    """The model's kind, at `--threshold` where given (a kind that has one: `check_model_kind`)."""
    if threshold is None:
        return trained
    kind = type(trained).from_settings({"threshold": threshold})
    if kind.scoring_change(trained):  # (said where it differs from the model's)
        log.info("predicting at threshold %g; the model was trained and tested at %g", threshold,
                 getattr(trained, "threshold", math.nan))
    return kind


def check_inputs_fit(config: Any, args: argparse.Namespace, given_pairs: bool) -> None:
    """A model nlptrain trained on text pairs scores pairs, one trained on single texts single
    texts (its config.json says which; a model from elsewhere is not checked): the other input
    gives scores without meaning, and no error of its own."""
    pairs = getattr(config, "nlptrain_text_pair", None)
    if pairs is True and not given_pairs:
        raise ConfigError(f"{args.model} was trained on text pairs: name the column (or JSON "
                          f"field) of each pair's second text with --text-pair-column, the first "
                          f"with --text-column (now {args.text_column!r})")
    if pairs is False and given_pairs:
        raise ConfigError(f"{args.model} was trained on single texts, not pairs: drop "
                          f"--text-pair-column {args.text_pair_column}")


class InputLayout(NamedTuple):
    text: str | int  # the text's column (name or 0-based index) or JSON field
    pair: str | int  # the pair's second text's, or "" for single texts
    header: bool  # tsv/csv: the first row names the columns
    quoted: bool  # tsv: a cell may be CSV-quoted
    format: str  # --input-format, or the training file's where a model of pairs would read lines


def input_layout(args: argparse.Namespace) -> InputLayout:
    """How to read --input: each option as given, else as the run that trained the model read
    its training file (its config.json), else text (and text_pair for a model of pairs), a
    header row, no quoting."""
    from nlptrain.data.readers import FORMATS_BY_SUFFIX

    config = saved_model_config(args.model)
    trained = config.get("nlptrain_columns") or {}

    def given_or_trained(value: Any, key: str, default: Any) -> Any:
        return value if value is not None else trained.get(key, default)

    pairs = config.get("nlptrain_text_pair")  # a model of single texts reads no pair by default
    layout = InputLayout(given_or_trained(args.text_column, "text", "text"),
                         given_or_trained(args.text_pair_column, "text_pair", "text_pair")
                         if args.text_pair_column is not None or pairs else "",
                         given_or_trained(args.header, "header", True),
                         given_or_trained(args.quoted, "quoted", False), args.input_format)
    fmt = args.input_format if args.input_format != "auto" else \
        FORMATS_BY_SUFFIX.get(Path(args.input).suffix.lower())
    if fmt is None and layout.pair != "" and trained.get("format") in ("tsv", "csv"):
        # A file of lines holds no pairs: read as the training file was (MRPC's .txt is a TSV).
        fmt = trained["format"]
        layout = layout._replace(format=fmt)
        log.info("%s: read as %s, as the model's training file was (a model of pairs reads "
                 "columns; --input-format names another)", args.input, fmt)
    if fmt in ("jsonl", "parquet") and trained.get("header") is False:  # named columns: the
        # numbers of a training file without names (a TSV) do not carry over; a Parquet's do
        for given, key, name in ((args.text_column, "text", "text"),
                                 (args.text_pair_column, "pair", "text_pair")):
            if given is None and isinstance(getattr(layout, key), int):
                log.info("%s: %s column '%s', not the training file's column %d (a file "
                         "without names); --%s-column names another", args.input, key.replace(
                             "pair", "text pair"), name, getattr(layout, key),
                         name.replace("_", "-"))
                layout = layout._replace(**{key: name})
    if args.header is None and not layout.header and fmt in ("tsv", "csv"):  # (a header's files)
        log.info("%s: read without a header row, as the model's training file was (--header "
                 "if it has one)", args.input)
    elif args.header is None and isinstance(layout.text, int) and fmt in ("tsv", "csv"):
        # Columns by number read any first row as the header: a file without one loses a text.
        log.info("%s: its first row is read as a header row, not predicted, as the model's "
                 "training file had one (--no-header if it has none)", args.input)
    return layout


def check_files(args: argparse.Namespace) -> None:
    """Before `--nproc` starts workers: a mistake in the files is one error, not one a rank."""
    from nlptrain.data.text_files import open_checked

    path = Path(args.input)
    if args.input == "-" or (path.exists() and not path.is_file() and not path.is_dir()):
        raise ConfigError(f"--input {args.input}: a stream is read by one process; drop --nproc, "
                          "or give a file")
    open_checked(path, "input")
    if not (Path(args.model) / "config.json").is_file():
        raise ConfigError(f"{args.model}: no config.json; give a saved model folder (a run's model/)")
    check_model_kind(args)
    check_output(args.output, args.input)  # (a descriptor: open, for writing, in this process)
    check_reaches_workers(args.output, "the --nproc workers", ", or drop --nproc")


def run_predict(args: argparse.Namespace, dist: Backend) -> None:
    from nlptrain import precision
    from nlptrain.config import TrainConfig
    from nlptrain.data import Collator, TokenizedDataset
    from nlptrain.data.readers import read_texts
    from nlptrain.evaluate import predict
    from nlptrain.models import (
        check_max_length,
        load_saved_model,
        load_tokenizer,
        resolve_model_path,
    )

    check_model_kind(args)
    resolve_model_path(args.model)  # a wrong --model is said first, not a column its absence hid
    fmt = output_format(args.output, args.format)
    environment = dist.environment  # (a worker of an agent, or of srun or mpirun: not the shell's child)
    if environment.has_agent or dist.world_size > 1:
        check_reaches_workers(args.output, f"the workers of {environment.name}")
    dist.on_main(lambda: check_output(args.output, args.input))
    # Rank 0 reads (a bad file is reported once); every rank gets the texts.
    layout = input_layout(args)
    args.text_column, args.text_pair_column = layout.text, layout.pair

    def read() -> Any:
        with readable_input(args.input) as path:
            return read_texts(path, layout.format, layout.text, layout.pair,
                              args.keep_columns, layout.header, layout.quoted)

    texts = dist.on_main(read)
    tokenizer = load_tokenizer(args.model)
    model = load_saved_model(args.model)
    kind = at_threshold(from_model_config(model.config), args.threshold)
    check_inputs_fit(model.config, args, texts.pairs is not None)
    if args.all_probs and not kind.has_classes:
        log.warning("--all-probs: a %s model has no label probabilities; its score is written",
                    kind.name)
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    max_length = args.max_length or default_max_length(Path(args.model), tokenizer, model)
    check_max_length(model, max_length, "--max-length" if args.max_length else
                     str(Path(args.model).parent / "config.json"))
    dataset = TokenizedDataset.from_texts(texts.texts, [-1] * len(texts), tokenizer, max_length,
                                          pairs=texts.pairs)
    log.info("%s: %d %s, %d process(es), max length %d tokens, %s %s", args.input, len(texts),
             "text pairs" if texts.pairs else "texts", dist.world_size, max_length, kind.name,
             names)
    model.to(dist.device)
    chosen = precision.for_scoring(args.precision, getattr(model.config, "nlptrain_precision", None),
                                   dist.device, dist)
    # Batches as the run's evaluation made them: in bf16 another padded width rounds otherwise.
    made = getattr(model.config, "nlptrain_eval_batches", None) or {}
    collate = Collator(tokenizer.pad_token_id or 0, made.get("pad_to"),
                       made.get("multiple", TrainConfig.pad_to_multiple_of),
                       made.get("limit") or max_length)
    batch_size = args.batch_size or made.get("batch_size", TrainConfig.eval_batch_size)
    found = predict(model, dataset, dist, collate, batch_size, chosen, kind)
    dist.on_main(lambda: write_output(rows_of(texts, found.outputs, names, args.all_probs, kind),
                                      args.output, fmt, names, args.all_probs))


def cmd_predict(args: argparse.Namespace) -> int:
    import_libraries()
    from nlptrain import recipe
    from nlptrain.logs import setup_logging

    with recipe.backend(args.timeout) as dist:
        setup_logging(dist.rank, args.log_level)
        run_predict(args, dist)
    return 0


def column(text: str) -> str | int:
    """A column's name, or its 0-based index (digits), as a task's [data] takes it."""
    return int(text) if text.strip().isdigit() else text


def column_names(text: str) -> tuple[str | int, ...]:
    """--keep-columns' comma-separated names or indexes (argparse reports an empty one)."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty column name")
    return tuple(column(name) for name in names)


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "predict", help="label the texts of a file with a saved model",
        description="Label each text of a file with a saved model (a run's model/ folder): row "
        "number, the input line it came from, what the model's kind gives (single-label: label "
        "and its probability; multi-label: labels over the threshold and their probabilities; "
        "regression: score) and the text (and pair), in input order; the same with --nproc N "
        "or torchrun. Pairs and columns: as the run trained on them, unless given.",
        epilog="examples:\n  python -m nlptrain predict --model runs/RUN/model --input texts.txt\n"
        "  python -m nlptrain predict --nproc 2 --model runs/RUN/model --input in.tsv "
        "--output out.tsv\n"
        "  torchrun --nproc_per_node 2 -m nlptrain predict --model runs/RUN/model "
        "--input in.tsv --output out.jsonl --all-probs",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a saved model folder (a run's model/)")
    parser.add_argument("--input", required=True, metavar="FILE",
                        help="texts: .tsv/.csv (a header row or not, as the model's run read "
                        "its files; see --header), .jsonl, .parquet, or one text per line; "
                        "'-': standard input (one text per line unless --input-format says)")
    parser.add_argument("--output", metavar="FILE",
                        help="where to write (.tsv, or .jsonl / .json: JSON Lines, one object a row; "
                        "default: stdout, TSV)")
    parser.add_argument("--format", choices=["tsv", "jsonl"],
                        help="output format (default: from --output's suffix, else tsv)")
    parser.add_argument("--input-format", default="auto", choices=["auto", "tsv", "csv", "jsonl",
                                                                   "parquet", "lines"],
                        help="input format (default: from the suffix; unknown suffix: lines)")
    parser.add_argument("--text-column", type=column, default=None,
                        help="column (name, or 0-based index) or JSON field holding the text "
                        "(default: the one the model was trained on, else text)")
    parser.add_argument("--text-pair-column", type=column, default=None,
                        help="column or JSON field holding a pair's second text, for a model "
                        "trained on pairs (default: the one it was trained on, else text_pair; "
                        "none for a model of single texts)")
    parser.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                        help="tsv/csv: the first row names the columns; --no-header: it is data, "
                        "columns are 0-based indexes (default: as the model's training file, "
                        "else a header)")
    parser.add_argument("--quoted", action=argparse.BooleanOptionalAction, default=None,
                        help="tsv: a cell may be CSV-quoted (default: as the model's training "
                        "file, else not)")
    parser.add_argument("--keep-columns", type=column_names, default=(), metavar="NAMES",
                        help="input columns (or JSON fields) to write beside each prediction, "
                        "comma-separated, e.g. id (to join the output back); one named like an "
                        "output column (label, text, ...) is written as input_<name>")
    parser.add_argument("--all-probs", action="store_true",
                        help="also write the probability of every label")
    parser.add_argument("--threshold", type=probability, metavar="FLOAT",
                        help="multi-label: predict the labels whose probability reaches this "
                        "(default: the threshold the model was trained and tested at)")
    parser.add_argument("--max-length", type=positive_int, default=0,
                        help="truncate texts to this many tokens (default: the run's max_length)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="texts per batch per process (default: the run's eval_batch_size, "
                        "as its evaluation scored them; else 64)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto | fp32 | bf16 | fp16 (autocast; default: auto, the precision "
                        "the model was trained and tested in, else the faster one here)")
    parser.add_argument("--timeout", type=positive_seconds, default=600,
                        help="seconds a rank waits for the others before failing (default: 600)")
    add_log_level(parser)
    add_launch_options(parser)
    parser.set_defaults(handler=cmd_predict, check_before_launch=check_files)
