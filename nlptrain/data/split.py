"""`nlptrain split`: one training file -> N per-rank files plus a manifest, in constant memory.

    python -m nlptrain split --task sst2 --data-dir DATA --world-size 4 --shuffle --out shards/
    python -m nlptrain split big.tsv --world-size 4 --by size

Rank r of a job with N processes then reads only `part-0000r-of-0000N.jsonl` (the `PerRankData`
callback, or `[data] train_shards`), so a machine holds the data once, not N times.

The input is read row by row (any format the readers know; rows are checked the same way) and each
part is JSON lines `{"text": ..., "label": ...}` with the label as written in the source, so any
text (tabs, quotes, newlines) survives. Rows are dealt round-robin (`--by rows`: row counts differ
by at most one) or each to the part with the fewest characters so far (`--by size`). `--shuffle`
first scatters the rows into random temporary buckets of about 8 MB and shuffles each bucket in
memory (a uniform shuffle, seeded), so memory stays flat however large the file is (up to 4 GB;
beyond that the 512 buckets grow with it).
`manifest.json` records the world size, each part's rows, bytes and checksum, the source files'
checksum, the seed, and the label values seen.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from nlptrain.data.label_order import LabelOrder, label_key
from nlptrain.durable import new_staging_folder, replace_folder
from nlptrain.errors import ConfigError, DataError, every_rank
from nlptrain.logs import add_log_level

MANIFEST = "manifest.json"
FORMAT = "nlptrain-shards"
VERSION = 1
BUCKET_BYTES = 8 << 20  # rows held in memory at once while shuffling
MAX_BUCKETS = 512       # open files while shuffling; a bucket grows past 8 MB beyond 4 GB input
MAX_LABELS = 10_000      # more distinct labels than this is a wrong label column

log = logging.getLogger("nlptrain")


def part_name(rank: int, world_size: int) -> str:
    return f"part-{rank:05d}-of-{world_size:05d}.jsonl"


@dataclass
class Manifest:
    """What `manifest.json` of a per-rank folder says."""

    world_size: int
    parts: list[dict[str, Any]]  # per rank: file, rows, bytes, checksum
    labels: list[str]            # label values seen, sorted like LabelVocab.infer
    source: dict[str, Any] = field(default_factory=dict)  # files, bytes, checksum
    by: str = "rows"
    shuffle: bool = False
    seed: int | None = None
    format: str = FORMAT
    version: int = VERSION

    @property
    def rows(self) -> list[int]:
        return [int(p["rows"]) for p in self.parts]

    def save(self, folder: Path) -> None:
        body = {"format": self.format, "version": self.version, "world_size": self.world_size,
                "rows": sum(self.rows), **{k: v for k, v in asdict(self).items()
                                           if k not in ("format", "version", "world_size")}}
        (Path(folder) / MANIFEST).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def of_task(cls, task: Any) -> tuple[Path, Manifest]:
        """The folder of a task's per-rank files (`[data] train_shards`, in its data folder) and
        its manifest."""
        folder = Path(task.data_dir or ".") / task.data.train_shards
        return folder, cls.load(folder, typed=task.data.train_shards)

    @classmethod
    def load(cls, folder: str | Path, typed: str | None = None) -> Manifest:
        """The manifest in `folder`; `typed`: the folder as the task gave it, relative to its
        data folder (where it names one in the working folder instead, the error says so)."""
        path = Path(folder) / MANIFEST
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            here = Path(typed or "") / MANIFEST
            if typed and here.is_file() and here.resolve() != path.resolve():
                raise DataError(f"{path}: no manifest; ./{typed} holds one, but train_shards is "
                                "relative to the task's data folder: give --data-dir . or its "
                                "absolute path") from None
            raise DataError(f"{path}: no manifest; make the per-rank files with "
                            "`python -m nlptrain split ... --world-size N --out "
                            f"{folder}`") from None
        except (OSError, json.JSONDecodeError) as err:
            raise DataError(f"{path}: not a readable manifest ({err}); run split again") from None
        if raw.get("format") != FORMAT or raw.get("version") != VERSION:
            raise DataError(f"{path}: not an nlptrain split manifest (version {VERSION}); "
                            "run `python -m nlptrain split` again")
        names = {f.name for f in fields(cls)}
        manifest = cls(**{k: v for k, v in raw.items() if k in names})
        if len(manifest.parts) != manifest.world_size:
            raise DataError(f"{path}: lists {len(manifest.parts)} parts for world size "
                            f"{manifest.world_size}; run split again")
        return manifest

    def check_world_size(self, world_size: int, folder: str | Path) -> None:
        """Refuse a job whose process count is not the one the files were made for."""
        if world_size != self.world_size:
            raise every_rank(ConfigError(
                f"{Path(folder) / MANIFEST}: the per-rank files were made for {self.world_size} "
                f"ranks, but this job runs {world_size}; launch {self.world_size} processes, or "
                f"split again with --world-size {world_size}"))

    def part_path(self, folder: str | Path, rank: int) -> Path:
        path = Path(folder) / self.parts[rank]["file"]
        if not path.is_file():
            raise DataError(f"{path}: per-rank file of rank {rank} is missing; run split again")
        return path


class _Parts:
    """The N open part files and the rule that deals each row to one of them."""

    def __init__(self, folder: Path, world_size: int, by: str) -> None:
        self.names = [part_name(r, world_size) for r in range(world_size)]
        self.handles = [open(folder / n, "w", encoding="utf-8", newline="\n") for n in self.names]
        self.rows = [0] * world_size
        self.written = 0
        self.by = by
        self.sizes = [(0, r) for r in range(world_size)]  # heap of (characters, rank)

    def write(self, line: str) -> int:
        """Deal `line` to a part; its rank."""
        if self.by == "size":
            size, rank = heapq.heappop(self.sizes)
            heapq.heappush(self.sizes, (size + len(line), rank))
        else:
            rank = self.written % len(self.rows)
        self.handles[rank].write(line)
        self.rows[rank] += 1
        self.written += 1
        return rank

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


def split_rows(rows: Iterable[Any], folder: Path, world_size: int, by: str = "rows",
               shuffle: bool = False, seed: int = 0, input_bytes: int = 0,
               bucket_bytes: int = BUCKET_BYTES, kind: Any = None,
               label_ids: dict[str, int] | None = None) -> Manifest:
    """Write rows (rows.Row) to the part files in `folder`; memory stays flat. `kind` (a
    task kind) says which label values a row names: a multi-label row names several.
    `label_ids`: the task's labels, where it names them (each row's is checked against them)."""
    from nlptrain.data import LabelVocab
    from nlptrain.data.tokenized import file_digest
    from nlptrain.kinds import SingleLabel

    kind = kind or SingleLabel()

    if world_size < 1:
        raise ConfigError(f"--world-size must be at least 1, got {world_size}")
    if by not in ("rows", "size"):
        raise ConfigError(f"--by {by}: choose rows (round-robin) or size (balance characters)")
    labels: set[str] = set()

    sources: dict[str, None] = {}  # the files read, in order: named by the errors

    def lines() -> Iterable[tuple[str, tuple[str, ...]]]:  # each row's JSON line and its labels
        for row in rows:
            sources.setdefault(row.path)
            labels.update(kind.label_values(row.label))
            if label_ids or not kind.has_classes:  # a label or score read as training will:
                kind.encode([row.label], label_ids or {},  # said at its source line, not later
                            lambda _, row=row: (row.path, row.line))  # by the run, of the manifest
            if len(labels) > MAX_LABELS:
                raise DataError(f"{row.path}:{row.line}: over {MAX_LABELS} distinct labels; "
                                "is label_column the right column?")
            record = {"text": row.text, "label": row.label}
            if row.pair is not None:
                record["text_pair"] = row.pair
            yield json.dumps(record, ensure_ascii=False) + "\n", label_key(row.label, kind)

    parts = _Parts(folder, world_size, by)
    orders = [LabelOrder() for _ in range(world_size)]  # file order: each part's, as written
    try:
        if shuffle:
            for line in _shuffled((line for line, _ in lines()), folder, seed, input_bytes,
                                  bucket_bytes):
                parts.write(line)
        else:
            for line, key in lines():
                orders[parts.write(line)].add(key)
    finally:
        parts.close()
    source = ", ".join(sources) or "the input"
    if not sum(parts.rows):
        raise DataError(f"{source}: holds no rows")
    if not all(parts.rows):  # a rank with no rows could not train: refused now, not at the run
        raise DataError(f"{source}: holds {sum(parts.rows)} row(s), too few for {world_size} "
                        f"per-rank files (each needs one at least); split for fewer ranks")
    infos = [{"file": name, "rows": n, "bytes": (folder / name).stat().st_size,
              "checksum": file_digest([folder / name])} for name, n in zip(parts.names, parts.rows,
                                                                            strict=True)]
    warn_if_grouped(source, dict(zip(parts.names, orders, strict=True)))
    return Manifest(world_size, infos, LabelVocab.infer(sorted(labels)).values, by=by,
                    shuffle=shuffle, seed=seed if shuffle else None)


def warn_if_grouped(source: str, orders: dict[str, LabelOrder]) -> None:
    """One warning where parts in file order come grouped by label (see label_order.py)."""
    grouped = [(name, order) for name, order in orders.items() if order.grouped]
    if not grouped:
        return
    where = "every part" if len(grouped) == len(orders) else f"{len(grouped)} of {len(orders)} parts"
    name, order = grouped[0]
    log.warning("%s: the rows come grouped by label in %s (%s: %s): read in file order, each "
                "rank trains class by class and learns little; give --shuffle (or train with "
                "--shard-shuffle)", source, where, name, order)


def _shuffled(lines: Iterable[str], folder: Path, seed: int, input_bytes: int,
              bucket_bytes: int) -> Iterable[str]:
    """A uniform random order in two passes: scatter into random buckets, shuffle each."""
    rng = random.Random(seed)
    count = min(max(1, -(-input_bytes // bucket_bytes)), MAX_BUCKETS)
    scratch = Path(tempfile.mkdtemp(prefix=".buckets-", dir=folder))
    try:
        buckets = [open(scratch / f"{b}", "w+", encoding="utf-8", newline="\n") for b in range(count)]
        for line in lines:
            buckets[rng.randrange(count)].write(line)
        for bucket in buckets:
            bucket.seek(0)
            held = list(bucket)  # line by line: no second copy of the bucket as one string
            bucket.close()
            rng.shuffle(held)
            yield from held
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def split_task(task: Any, out: Path, world_size: int, by: str = "rows", shuffle: bool = False,
               seed: int = 0, which: str = "train", overwrite: bool = False) -> Manifest:
    """Split the task's `which` file into `out`; written under a temporary name, then renamed."""
    from nlptrain.config import file_spec
    from nlptrain.data import LabelVocab, entry_files
    from nlptrain.data.readers import iter_rows
    from nlptrain.data.tokenized import file_digest
    from nlptrain.kinds import from_task

    spec = file_spec(task, which)
    files = entry_files(task, which)
    if spec is None or files is None:
        raise ConfigError(f"task '{task.name}' has no [data] {which} file to split")
    vocab = LabelVocab.from_config(task.data.labels) if task.data.labels else None
    values = vocab.values if vocab else []
    _check_out(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = new_staging_folder(out.parent, f".{out.name}.tmp-")
    except OSError as err:  # a parent that is a file, read-only, ...: said, not a traceback
        raise ConfigError(f"{out}: cannot be written ({err.strerror or err}); choose another "
                          "--out") from err
    try:
        kind = from_task(task)
        rows = iter_rows(spec, task.data_dir, values, which, empty_label_ok=kind.empty_label_ok)
        manifest = split_rows(rows, staging, world_size, by, shuffle, seed,
                              sum(f.stat().st_size for f in files), kind=kind,
                              label_ids=vocab.ids() if vocab else None)
        manifest.source = {"files": [str(f) for f in files], "format": spec.format,
                           "bytes": sum(f.stat().st_size for f in files),
                           "checksum": file_digest(files)}
        manifest.save(staging)
        _check_out(out, overwrite)
        if out.exists():
            shutil.rmtree(out) if (out / MANIFEST).is_file() else out.rmdir()
        replace_folder(staging, out, replace_existing=False)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _check_out(out: Path, overwrite: bool) -> None:
    """`out` is new, empty, or (with `overwrite`) an earlier split's folder and nothing else:
    any manifest.json made a folder one, and --overwrite removed it whole, files of others too."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    others = _not_a_splits(out)
    if others:
        raise ConfigError(f"{out}: exists and is not a split folder ({others}); choose another "
                          "--out")
    if not overwrite:
        raise ConfigError(f"{out}: holds per-rank files already; pass --overwrite to replace them")


def _not_a_splits(out: Path) -> str:
    """What in `out` is no split's: '' where it holds a split's manifest and its parts alone."""
    from nlptrain.data.tokenized import CACHE_FOLDER  # (torch: not for `--help`)

    try:
        body = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"no {MANIFEST} of a split"
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        return f"its {MANIFEST} is not a split's"
    parts = {MANIFEST, CACHE_FOLDER, *(str(p.get("file")) for p in body.get("parts", [])
                                       if isinstance(p, dict))}  # (a run's token cache of them)
    extra = sorted(p.name for p in out.iterdir() if p.name not in parts)
    return f"it holds {', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''} too" if extra else ""


# -- the command ---------------------------------------------------------------------------

def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "split", help="write one file per rank (plus manifest.json) for per-rank training",
        description="Split a training file into N per-rank files and a manifest, in constant "
        "memory. Train on them with --train-shards DIR (each rank reads only its own file).")
    parser.add_argument("file", nargs="?", help="the file to split (else --task TASK's train "
                        "file: give one of the two)")
    parser.add_argument("--world-size", type=int, required=True, metavar="N",
                        help="number of ranks (processes) of the jobs that will read the files")
    parser.add_argument("--out", metavar="DIR",
                        help="output folder (default: ./STEM-N-ranks, e.g. ./train-4-ranks)")
    parser.add_argument("--by", choices=["rows", "size"], default="rows",
                        help="rows: round-robin, counts differ by at most one; size: balance "
                        "characters, row counts may differ (default: rows)")
    parser.add_argument("--shuffle", action="store_true",
                        help="shuffle the rows first (seeded); without it the parts keep the "
                        "source's order, which a run reads as it is unless --shard-shuffle (a "
                        "source grouped by label is warned of)")
    parser.add_argument("--seed", type=int, default=42, help="shuffle seed (default: 42)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier split in --out")
    parser.add_argument("--task", help="task file or shipped task whose file to split")
    parser.add_argument("--which", choices=["train", "valid", "test"], default="train",
                        help="which file of the task (default: train)")
    parser.add_argument("--data-dir", help="folder the task's data paths start from")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="set any task key, e.g. --set data.labels='[\"neg\",\"pos\"]'")
    for key, help_text in (("format", "tsv | csv | jsonl | parquet | lines | auto (by extension)"),
                           ("text_column", "text column (name or 0-based index)"),
                           ("label_column", "label column (name or 0-based index)")):
        flag = "--data-format" if key == "format" else "--" + key.replace("_", "-")
        parser.add_argument(flag, dest=f"set:data.{key}", metavar=key.split("_")[0].upper(),
                            help=help_text)
    parser.add_argument("--header", dest="set:data.header", action=argparse.BooleanOptionalAction,
                        help="tsv/csv: the first row names the columns (default: true)")
    add_log_level(parser)
    parser.set_defaults(handler=cmd_split)


def cmd_split(args: argparse.Namespace) -> int:
    from nlptrain.config import TaskConfig, file_spec
    from nlptrain.kinds import DEFAULT, KINDS
    from nlptrain.logs import setup_logging
    from nlptrain.task_options import apply_overrides, resolve_task

    setup_logging(0, args.log_level)
    if args.task and args.file and not args.data_dir:  # FILE is what is read: the task's data
        args.data_dir = os.environ.get("NLPTRAIN_DATA_DIR") or os.getcwd()  # folder is not needed
    if args.task:
        task = resolve_task(args)
    elif args.file:
        task = apply_overrides(TaskConfig(name=Path(args.file).stem, data_dir=os.getcwd()), args)
    else:
        raise ConfigError("split: give a FILE or --task TASK")
    if args.file:
        setattr(task.data, args.which, str(Path(args.file).resolve()))
    spec = file_spec(task, args.which)
    # Default: the current folder, never beside the input (data folders are often shared).
    stem = Path(spec.path).name.split(".")[0] if spec else "split"
    out = Path(args.out or f"{stem}-{args.world_size}-ranks").resolve()
    try:
        manifest = split_task(task, out, args.world_size, args.by, args.shuffle, args.seed,
                              args.which, args.overwrite)
    except DataError as err:  # a file of another kind, read as single-label: say how to say so
        if task.data.kind == DEFAULT.name and any(
                said in str(err) for said in ("the row has no label", "distinct labels")):
            others = [name for name in KINDS if name != DEFAULT.name]
            raise DataError(f"{err} (read as {DEFAULT.name.replace('_', '-')}: a "
                            f"{' or '.join(name.replace('_', '-') for name in others)} file needs "
                            f"--set data.kind={' or ='.join(others)}, or its --task)") from None
        raise
    rows = manifest.rows
    print(f"{sum(rows)} rows -> {len(rows)} files of {min(rows)}-{max(rows)} rows"
          f"{f', shuffled (seed {args.seed})' if args.shuffle else ''}, by {args.by}, in {out}\n"
          f"train with: --train-shards {out} and {manifest.world_size} processes "
          f"({len(manifest.labels)} labels seen: {', '.join(manifest.labels[:20])}"
          f"{', ...' if len(manifest.labels) > 20 else ''})")
    return 0
