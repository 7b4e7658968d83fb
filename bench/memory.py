"""Memory per rank of four ways to feed N ranks one large corpus (issue 4). Prints one table.

    python bench/memory.py                    # 1,000,000 rows, 1 2 4 ranks (several minutes)
    python bench/memory.py --quick            # 100,000 rows, 1 2 ranks
    python bench/memory.py --rows 2000000 --ranks 2 4 --modes all per-rank

Modes, each through nlptrain's own code path:
  all       every rank reads and tokenizes the whole file (`load_file` without cache) and walks
            its share with the trainer's ShardedSampler (= `--no-cache` training today)
  per-rank  `nlptrain split` files; the PerRankData callback loads only this rank's file
  mmap      the token cache, built once beforehand; every rank memory-maps it (`load_file` with a
            cache hit) and walks its share with ShardedSampler
  stream    StreamingDataset: reads the file lazily, keeps rows i % N == rank, shuffle buffer 10k

What one rank does: start (torch, transformers, nlptrain, MiniLM tokenizer), note its RSS
(baseline), reset the peak (/proc/self/clear_refs), load the data, then one pass over all of its
batches (batch 64, dynamic padding with the real Collator). No model. Ranks run at the same time,
as spawned processes (fresh interpreters, like torchrun), and measure after every rank finished
its pass, while all still hold their data:
  peak      VmHWM: peak resident set since the baseline (file pages of a mapping count in full)
  data      peak - baseline: what the data added to this rank
  +pss      Pss from smaps_rollup: shared pages divided among the processes mapping them
  +anon     Anonymous from smaps_rollup: heap memory this rank alone owns; mapped cache pages
            are file pages (page cache), shareable by every rank whenever they map them
  (+pss and +anon: growth over the baseline, sampled every 256 batches and at the end)
Columns show the largest rank; "sum" adds the peaks of all ranks. `split` and `cache build` rows
are the one-off preparation steps, measured the same way in one process.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("all", "per-rank", "mmap", "stream")
WORDS = ("the a an of to and in is it that was for on with as his her they at be this have from "
         "or one had by word but not what all were we when your can said there use each which she "
         "do how their if will up other about out many then them these so some would make like him "
         "into time has look two more write go see number no way could people my than first water "
         "been call who oil its now find long down day did get come made may part film movie plot "
         "actor scene story good bad great awful dull funny long short music sad happy").split()
LABELS = ["0", "1"]
MAX_LENGTH = 64
BATCH = 64


def write_corpus(path: Path, rows: int, seed: int = 0) -> Path:
    """`text<TAB>label` rows of 4-12 common words (about 10 tokens each)."""
    if path.is_file():
        return path
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    with open(staging, "w", encoding="utf-8") as out:
        out.write("text\tlabel\n")
        for begin in range(0, rows, 10_000):
            out.write("".join(f"{' '.join(rng.choices(WORDS, k=rng.randint(4, 12)))}\t"
                              f"{rng.randint(0, 1)}\n" for _ in range(min(10_000, rows - begin))))
    staging.replace(path)
    return path


# -- measuring --------------------------------------------------------------------------------

def proc_kb(name: str) -> dict[str, int]:
    out = {}
    with open(f"/proc/self/{name}") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0])
    return out


def reset_peak() -> None:
    try:  # "5" resets VmHWM to the current RSS (Linux 4.0+)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # then the peak counts from process start; the baseline is still subtracted


def memory() -> dict[str, float]:
    status, rollup = proc_kb("status"), proc_kb("smaps_rollup")
    mb = 1 / 1024
    return {"peak": status["VmHWM"] * mb, "rss": status["VmRSS"] * mb, "pss": rollup["Pss"] * mb,
            "anon": rollup["Anonymous"] * mb}


# -- one rank -----------------------------------------------------------------------------------

def loader_for(mode: str, corpus: Path, rank: int, world: int, work: Path, tokenizer: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader

    from nlptrain.callbacks import PerRankData
    from nlptrain.config import TrainConfig, file_spec
    from nlptrain.data import Collator, LabelVocab, load_file
    from nlptrain.data.streaming import StreamingDataset
    from nlptrain.samplers import ShardedSampler

    task = task_for(corpus)
    spec, vocab = file_spec(task, "train"), LabelVocab.from_config(LABELS)
    collate = Collator(tokenizer.pad_token_id)
    if mode == "per-rank":
        from types import SimpleNamespace

        callback = PerRankData(shards_dir(work, corpus, world), vocab, MAX_LENGTH, shuffle=True,
                               tokenizer=tokenizer)
        trainer = SimpleNamespace(dist=SimpleNamespace(rank=rank, world_size=world), collate=collate,
                                  config=TrainConfig(batch_size=BATCH), device=torch.device("cpu"),
                                  tokenizer=tokenizer, label_names=vocab.names, train_data=None)
        callback.on_train_start(trainer)
        return trainer.train_data
    if mode == "stream":
        ids = {v: i for i, v in enumerate(vocab.values)}
        stream = StreamingDataset(spec, corpus.parent, ids, tokenizer, MAX_LENGTH, rank, world)
        stream.set_epoch(0)
        return DataLoader(stream, batch_size=BATCH, collate_fn=collate)
    cache = cache_dir(work, corpus) if mode == "mmap" else None
    dataset, _ = load_file(spec, corpus.parent, vocab, tokenizer, MAX_LENGTH, cache, "train")
    sampler = ShardedSampler(dataset, world, rank, shuffle=True, seed=0, lengths=dataset.lengths,
                             group_size=64 * BATCH)  # as the trainer makes it
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler, collate_fn=collate)


def task_for(corpus: Path) -> Any:
    from nlptrain.config import TaskConfig

    task = TaskConfig(name="memory", data_dir=str(corpus.parent))
    task.data.train, task.data.labels, task.model.max_length = corpus.name, LABELS, MAX_LENGTH
    return task


def shards_dir(work: Path, corpus: Path, world: int) -> Path:
    return work / f"{corpus.stem}-{world}-ranks"


def cache_dir(work: Path, corpus: Path) -> Path:
    return work / f"{corpus.stem}-cache"


def warm_up(tokenizer: Any) -> None:
    from torch.utils.data import DataLoader

    import nlptrain.callbacks
    import nlptrain.data.split
    import nlptrain.data.streaming
    import nlptrain.samplers  # noqa: F401
    from nlptrain.data import Collator, TokenizedDataset

    texts = [" ".join(WORDS[i:i + 12]) for i in range(256)]
    dataset = TokenizedDataset.from_texts(texts, [0] * len(texts), tokenizer, MAX_LENGTH)
    for _ in DataLoader(dataset, batch_size=BATCH, collate_fn=Collator(0)):
        pass


def rank_main(job: str, rank: int, world: int, corpus: str, work: str, barrier: Any,
              results: Any) -> None:
    os.environ.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                       "HF_HUB_OFFLINE": "1"})
    import gc

    import torch

    from nlptrain.models import load_tokenizer

    torch.set_num_threads(1)
    tokenizer = load_tokenizer("minilm")
    corpus_path, work_path = Path(corpus), Path(work)
    warm_up(tokenizer)  # imports and first-call buffers are not the data's
    gc.collect()
    barrier.wait(timeout=600)  # every rank started: shared library pages divide the same way
    base = memory()
    reset_peak()
    start = time.perf_counter()
    rows = 0
    if job == "split":
        from nlptrain.data.split import split_task

        manifest = split_task(task_for(corpus_path), shards_dir(work_path, corpus_path, world),
                              world, shuffle=True, seed=0, overwrite=True)
        rows = sum(manifest.rows)
    elif job == "cache build":
        shutil.rmtree(cache_dir(work_path, corpus_path), ignore_errors=True)
        from nlptrain.config import file_spec
        from nlptrain.data import LabelVocab, load_file

        dataset, _ = load_file(file_spec(task_for(corpus_path), "train"), corpus_path.parent,
                               LabelVocab.from_config(LABELS), tokenizer, MAX_LENGTH,
                               cache_dir(work_path, corpus_path), "train")
        rows = len(dataset)
    high = {"pss": float("nan"), "anon": float("nan")}  # one-off jobs: not sampled
    if job not in ("split", "cache build"):
        high = {"pss": 0.0, "anon": 0.0}
        for i, batch in enumerate(loader_for(job, corpus_path, rank, world, work_path, tokenizer)):
            rows += len(batch["labels"])
            if i % 256 == 0:  # Pss and anonymous memory have no kernel peak counter: sample
                now = memory()
                high = {k: max(high[k], now[k] - base[k]) for k in high}
    seconds = time.perf_counter() - start
    barrier.wait(timeout=3600)  # measure while every rank still holds its data
    now = memory()
    if job not in ("split", "cache build"):
        high = {k: max(high[k], now[k] - base[k]) for k in high}
    results.put({"rank": rank, "seconds": seconds, "rows": rows, "peak": now["peak"],
                 "data": now["peak"] - base["rss"], **high})
    barrier.wait(timeout=3600)


def run(job: str, world: int, corpus: Path, work: Path) -> dict[str, Any]:
    context = mp.get_context("spawn")
    count = 1 if job in ("split", "cache build") else world  # preparation: one process
    barrier, results = context.Barrier(count), context.Queue()
    procs = [context.Process(target=rank_main, args=(job, r, world, str(corpus), str(work),
                                                     barrier, results)) for r in range(count)]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"{job} with {world} rank(s): a rank failed ({proc.exitcode})")
    top = {key: max(g[key] for g in got) for key in ("peak", "data", "pss", "anon", "seconds")}
    return {"job": job, "ranks": world, "rows": sum(g["rows"] for g in got), **top,
            "sum": sum(g["peak"] for g in got), "sum_data": sum(g["data"] for g in got)}


# -- the table ----------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> str:
    head = ("| what | corpus rows | ranks | peak RSS/rank | data share/rank | +Pss/rank | "
            "+anon/rank | sum of peak RSS | sum of data shares | s |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        cells = [r["peak"], r["data"], r["pss"], r["anon"], r["sum"], r["sum_data"], r["seconds"]]
        lines.append(f"| {r['job']} | {r['corpus_rows']:,} | {r['ranks']} | " +
                     " | ".join("-" if c != c else f"{c:.0f}" for c in cells) + " |")  # nan: -
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]], big: int, small: int) -> list[str]:
    found = {(r["job"], r["ranks"], r["corpus_rows"]): r for r in rows}
    out = []
    for (job, ranks, size), r in sorted(found.items()):
        whole = found.get(("all", ranks, size))
        if job == "per-rank" and whole and ranks > 1:
            bound = whole["data"] / ranks * 1.1
            out.append(f"per-rank, {ranks} ranks: data share {r['data']:.0f} MB vs (all)/N + 10% = "
                       f"{bound:.0f} MB -> {'OK' if r['data'] <= bound else 'ABOVE TARGET'}")
        if job in ("mmap", "stream") and size == big > small and (job, ranks, small) in found:
            low = found[(job, ranks, small)]
            out.append(f"{job}, {ranks} rank(s), corpus x{big / small:.0f}: data share "
                       f"{low['data']:.0f} -> {r['data']:.0f} MB, +anon {low['anon']:.0f} -> "
                       f"{r['anon']:.0f} MB, +Pss {low['pss']:.0f} -> {r['pss']:.0f} MB")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="corpus rows (default 1M)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--grow", type=int, default=4, help="mmap and stream also run on a corpus "
                        "this many times smaller, to show they stay flat (0: skip)")
    parser.add_argument("--quick", action="store_true", help="100,000 rows, ranks 1 2")
    parser.add_argument("--work", default="/tmp/nlptrain-memory", help="corpus, splits, cache")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.ranks = 100_000, [1, 2]
    work = Path(args.work)
    sizes = [args.rows] + ([args.rows // args.grow] if args.grow > 1 else [])
    corpora = {n: write_corpus(work / f"corpus-{n}.tsv", n) for n in sizes}
    plan: list[tuple[str, int, int]] = []
    for mode in args.modes:
        if mode == "per-rank":
            plan += [("split", n, args.rows) for n in args.ranks]
        if mode == "mmap":
            plan += [("cache build", 1, size) for size in sizes]
        plan += [(mode, n, args.rows) for n in args.ranks]
        if mode in ("mmap", "stream") and len(sizes) > 1:  # the same with a smaller corpus
            plan.append((mode, max(args.ranks), sizes[1]))
    done = []
    for job, ranks, size in plan:
        print(f"running {job} with {ranks} rank(s) on {size:,} rows ...", file=sys.stderr, flush=True)
        done.append({**run(job, ranks, corpora[size], work), "corpus_rows": size})
    print(f"\nCorpus: {args.rows:,} rows ({corpora[args.rows].stat().st_size / 2**20:.0f} MB TSV), "
          f"MiniLM tokenizer, max length {MAX_LENGTH}, batch {BATCH}; {os.cpu_count()} CPUs. "
          "All figures in MB, largest rank; + columns: growth from the baseline.\n")
    print(table(done))
    print()
    for line in verdicts(done, args.rows, args.rows // max(args.grow, 1)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
