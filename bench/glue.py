"""GLUE on the CPU: nlptrain against `transformers.Trainer`, both configured as `run_glue.py`.

Same model (MiniLM-L6), max length 128, batch 32 global (16 per rank x 2 ranks), lr 2e-5, 3
epochs, linear decay without warmup, no weight decay, clipping at 1.0, the same seeds; sentence
pairs encoded as real pairs by both. Both read the rows through nlptrain's task files (the same
rows, splits and token ids), and both are scored by the same metric code (nlptrain.kinds) on the
task's test split, so what differs is the training loop alone.

    python bench/glue.py --quick                       # RTE + MRPC, 1 seed (tens of minutes on 2 cores)
    python bench/glue.py                               # rte mrpc stsb cola sst2 x seeds 42 1 2
    python bench/glue.py --tasks rte --seeds 42 --train-rows 256 --epochs 1   # a smoke run

Each run is `torchrun --nproc_per_node 2` on gloo; the table prints each task's GLUE metric for
both (mean and range over seeds), train samples/s (training time only, no evaluation) and the
ratio. `--train-rows N` trains on the first N training rows (SST-2 uses 8,000 unless told).

Results go to bench/results/glue/ (`--out` to change), one file per task, contender and seed; a
finished run is reused (`--fresh` runs it again), so the 6-hour full table can be built in
pieces, and `--report` prints the table of what is there without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

GLUE_METRIC = {"rte": "accuracy", "mrpc": "f1", "stsb": "pearson", "cola": "mcc", "sst2": "accuracy"}
JOB = {"max_length": 128, "batch_size": 16, "lr": 2e-5, "epochs": 3}
SST2_ROWS = 8000  # of 67,349: SST-2's train is phrases; a documented subset keeps the CPU run short
# nlptrain's contenders and what each changes from the task's settings; "hf" is Trainer. The
# ablation batches in random order, as Trainer does, to tell the sampler's effect from the loop's.
NLPTRAIN = {"nlptrain": {}, "nlptrain-random": {"train.group_by_length": False}}


def data_dir() -> str:
    return str(common.default_data_dir())


def load_task(name: str, args: argparse.Namespace):
    """The shipped task with the run_glue settings (and the contender's own, if any)."""
    from nlptrain.task_files import apply_override, validate
    from nlptrain.task_files import load_task as read

    task = read(BENCH.parent / "tasks" / f"{name}.toml")
    task.data_dir = data_dir()
    for key, value in {"model.max_length": JOB["max_length"], "train.batch_size": JOB["batch_size"],
                       "train.lr": JOB["lr"], "train.epochs": args.epochs, "train.warmup_ratio": 0.0,
                       "train.weight_decay": 0.0, "train.scheduler": "linear",
                       "train.max_grad_norm": 1.0, "train.seed": args.seed,
                       "train.early_stopping": 0, **NLPTRAIN.get(args.contender, {})}.items():
        apply_override(task, key, value)
    validate(task, "bench/glue.py")
    return task


def worker(args: argparse.Namespace) -> None:
    """One contender on one rank (under torchrun); rank 0 writes the result file."""
    import torch

    from nlptrain import distributed, kinds
    from nlptrain.data import build_datasets
    from nlptrain.evaluate import predict
    from nlptrain.models import load_model, load_tokenizer
    from nlptrain.random_state import seed_everything
    from nlptrain.recipe import collator

    task = load_task(args.task, args)
    dist = distributed.from_env(1200)
    tokenizer = load_tokenizer(task.model.name)
    sets = build_datasets(task, tokenizer, dist)
    rows = args.train_rows or (SST2_ROWS if args.task == "sst2" else 0)
    train = sets.train.select(range(min(rows, len(sets.train)))) if rows else sets.train
    kind = kinds.from_task(task)
    seed_everything(args.seed)
    model = load_model(task.model.name, sets.vocab.names, 0, kind)
    start = time.perf_counter()
    if args.contender in NLPTRAIN:
        from nlptrain import DistTrainer

        trainer = DistTrainer(model, train, None, config=task.train, tokenizer=tokenizer,
                              collate=collator(tokenizer, task), dist=dist, kind=kind)
        trainer.fit()
        model = trainer.unwrapped_model
        trainer.close()
    else:
        model = hf_train(model, train, tokenizer, task, args.seed, dist)
    train_s = time.perf_counter() - start
    found = predict(model, sets.test, dist, collator(tokenizer, task), 64, "fp32", kind)
    metrics = kind.metrics(found.outputs, found.labels, sets.vocab.names)
    if dist.is_main:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, float)}
        Path(args.out).write_text(json.dumps({
            "contender": args.contender, "task": args.task, "seed": args.seed,
            "train_rows": len(train), "samples_per_s": len(train) * args.epochs / train_s,
            "train_s": train_s, "metrics": scalars, "torch_threads": torch.get_num_threads()}))
    dist.close()


def hf_train(model, train, tokenizer, task, seed: int, dist):
    """transformers.Trainer as run_glue.py sets it up (random sampling, dynamic padding)."""
    from torch.utils.data import Dataset
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    class Rows(Dataset):
        def __len__(self) -> int:
            return len(train)

        def __getitem__(self, i: int) -> dict:
            item = train[i]
            row = {"input_ids": item["input_ids"].tolist(), "labels": item["labels"].tolist()}
            if "token_type_ids" in item:
                row["token_type_ids"] = item["token_type_ids"].tolist()
            return row

    out = tempfile.mkdtemp(prefix="glue-hf-")
    settings = TrainingArguments(
        output_dir=out, num_train_epochs=task.train.epochs,
        per_device_train_batch_size=task.train.batch_size, learning_rate=task.train.lr,
        weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear", max_grad_norm=1.0,
        seed=seed, use_cpu=True, ddp_backend="gloo" if dist.world_size > 1 else None,
        ddp_find_unused_parameters=False, eval_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True)
    trainer = Trainer(model=model, args=settings, train_dataset=Rows(),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer)
    trainer.train()
    return trainer.model


def result_file(out: Path, contender: str, task: str, seed: int, args: argparse.Namespace) -> Path:
    """The run's file; a run off the run_glue recipe (epochs, rows) says so in its name."""
    off_recipe = (f"-e{args.epochs}" if args.epochs != JOB["epochs"] else "") + (
        f"-r{args.train_rows}" if args.train_rows else "")
    return out / f"{task}-{contender}-{seed}{off_recipe}.json"


def run_one(contender: str, task: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    result = result_file(out, contender, task, seed, args)
    if result.is_file() and not args.fresh:
        found = json.loads(result.read_text())
        print(f"  {task:5s} {contender:15s} seed {seed}: reused {result.name}", flush=True)
        return found
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc}", __file__, "worker", "--contender", contender,
               "--task", task, "--seed", str(seed), "--out", str(result), "--epochs",
               str(args.epochs), "--train-rows", str(args.train_rows)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // args.nproc)),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{task} {contender} seed {seed} failed:\n{done.stderr[-3000:]}")
    found = json.loads(result.read_text())
    print(f"  {task:5s} {contender:15s} seed {seed}: {GLUE_METRIC[task]} "
          f"{found['metrics'][GLUE_METRIC[task]]:.4f}, {found['samples_per_s']:.1f} samples/s",
          flush=True)
    return found


def table(results: list[dict], tasks: list[str], ours: str = "nlptrain") -> str:
    """Metric mean (range) over seeds, samples/s, and the speed ratio per seed (the two
    contenders of a seed run one after the other, so a table built over several sessions, on
    machines of different speed, still compares like with like). `ours` is the nlptrain
    contender in the table."""
    def cell(values: list[float], digits: int = 4, unit: str = "") -> str:
        """Mean, and (min-max) over several seeds."""
        if not values:
            return "-"
        mean = statistics.mean(values)
        spread = f" ({min(values):.{digits}f}-{max(values):.{digits}f})" if len(values) > 1 else ""
        return f"{mean:.{digits}f}{unit}{spread}"

    lines = [f"| task | GLUE metric | {ours} | transformers.Trainer | metric target | "
             f"{ours} samples/s | Trainer samples/s | speed ratio (per seed) |",
             "|---|---|---|---|---|---|---|---|"]
    for task in tasks:
        key = GLUE_METRIC[task]
        by = {c: {r["seed"]: r for r in results if r["task"] == task and r["contender"] == c}
              for c in (ours, "hf")}
        mine = [r["metrics"][key] for r in by[ours].values()]
        theirs = [r["metrics"][key] for r in by["hf"].values()]
        target = "-"
        if mine and theirs:  # inside Trainer's seed range, or within 1 point of its mean
            mean = statistics.mean(mine)
            held = (min(theirs) <= mean <= max(theirs)
                    or abs(mean - statistics.mean(theirs)) <= 0.01)
            target = "held" if held else "missed"
        ratios = [by[ours][s]["samples_per_s"] / by["hf"][s]["samples_per_s"]
                  for s in by[ours] if s in by["hf"]]
        speeds = [cell([r["samples_per_s"] for r in by[c].values()], 1) for c in by]
        lines.append(f"| {task} | {key} | {cell(mine)} | {cell(theirs)} | {target} | "
                     f"{speeds[0]} | {speeds[1]} | {cell(ratios, 2, 'x')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="compare", choices=["compare", "worker"])
    parser.add_argument("--quick", action="store_true", help="RTE + MRPC, seed 42")
    parser.add_argument("--tasks", nargs="+", default=list(GLUE_METRIC))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    parser.add_argument("--contenders", nargs="+", default=["nlptrain", "hf"],
                        choices=[*NLPTRAIN, "hf"],
                        help="nlptrain-random: nlptrain without length-grouped batches")
    parser.add_argument("--epochs", type=int, default=JOB["epochs"])
    parser.add_argument("--train-rows", type=int, default=0, help="first N train rows (0: all)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default="",
                        help="worker: result file; compare: results folder (bench/results/glue)")
    parser.add_argument("--fresh", action="store_true", help="run again what --out already has")
    parser.add_argument("--report", action="store_true",
                        help="print the table of the runs in --out; run nothing")
    parser.add_argument("--contender", default="nlptrain")
    parser.add_argument("--task", default="rte")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    if args.quick:
        args.tasks, args.seeds = ["rte", "mrpc"], [42]
    out = Path(args.out or BENCH / "results" / "glue")
    if args.report:
        wanted = [result_file(out, c, t, s, args) for t in args.tasks for s in args.seeds
                  for c in args.contenders]
        print(table([json.loads(f.read_text()) for f in wanted if f.is_file()], args.tasks,
                    our_contender(args.contenders)))
        return
    unusable = common.check_data_dir(Path(data_dir()), *common.task_folders(*args.tasks),
                                       option=False)
    if unusable:
        sys.exit(unusable)
    out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {platform.processor() or platform.machine()} "
          f"({common.cpu_model()}), {os.cpu_count()} cores; {args.nproc} ranks; results in {out}")
    results = [run_one(c, t, s, args, out) for t in args.tasks for s in args.seeds
               for c in args.contenders]
    print()
    print(table(results, args.tasks, our_contender(args.contenders)))


def our_contender(contenders: list[str]) -> str:
    """The nlptrain contender the table sets beside Trainer."""
    return next((c for c in contenders if c in NLPTRAIN), "nlptrain")


if __name__ == "__main__":
    main()
