"""What each fine-tuning technique does on a real task: a script a person runs (not a test).

TREC (6 classes, ABBR rare): test macro-F1 and ABBR's F1, plain against `class_weights =
"balanced"` and `label_smoothing = 0.1`. RTE (sentence pairs): test accuracy, plain against
`layer_lr_decay = 0.9`, FGM and R-Drop. Each configuration runs `nlptrain train` once per seed
(3 by default) and the table gives the mean, the range (min-max) and the difference of the means
from the plain run: a difference inside the seed ranges is noise, and the table says so.

    python bench/finetune.py                         # both tasks, 3 seeds, 1 process each
    python bench/finetune.py --nproc 2               # under torchrun, 2 ranks
    python bench/finetune.py --tasks rte --seeds 1 2 3 4 5
    python bench/finetune.py --tasks goemotions      # multi-label: balanced BCE pos_weight
    python bench/finetune.py --tasks trec --configs class_weights=balanced   # plain against one
    python bench/finetune.py --smoke                 # 1 seed, 1 layer, 5 steps: checks the wiring

Runs go to bench/results/finetune/<task>-<config>-<seed>/ (a finished one is reused; --fresh
reruns). The data is read from ../shared/data or $NLPTRAIN_DATA_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import common  # noqa: E402  (bench/, this script's folder, is first on sys.path)
from nlptrain.callbacks import FGM, RDrop

BENCH_DIR = Path(__file__).resolve().parent
HERE = str(Path(__file__).resolve())


class FGMCallback(FGM):  # --callback loads a class without arguments
    def __init__(self) -> None:
        super().__init__(epsilon=1.0)


class RDropCallback(RDrop):
    def __init__(self) -> None:
        super().__init__(alpha=1.0)


# task -> [(name, extra `nlptrain train` arguments)]
CONFIGS = {
    "trec": [("plain", []),
             ("class_weights=balanced", ["--set", "train.class_weights=balanced"]),
             ("label_smoothing=0.1", ["--set", "train.label_smoothing=0.1"])],
    "goemotions": [("plain", []),  # multi-label, rare labels: not in the default --tasks
                   ("class_weights=balanced", ["--set", "train.class_weights=balanced"])],
    "rte": [("plain", []),
            ("layer_lr_decay=0.9", ["--set", "train.layer_lr_decay=0.9"]),
            ("FGM(1.0)", ["--callback", f"{HERE}:FGMCallback"]),
            ("R-Drop(1.0)", ["--callback", f"{HERE}:RDropCallback"])],
}
METRICS = {"trec": ("macro_f1", "f1 ABBR"), "goemotions": ("macro_f1", "micro_f1"),
           "rte": ("accuracy",)}
SMOKE = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=5", "--set",
         "model.num_hidden_layers=1", "--set", "model.max_length=32"]


def data_dir() -> Path:
    return common.default_data_dir()


def run_one(task: str, extra: list[str], seed: int, out: Path, args: argparse.Namespace) -> dict:
    results = out / "results.json"
    if results.is_file() and not args.fresh:
        return json.loads(results.read_text())["test"]
    command = ["-m", "nlptrain", "train", "--task", task, "--data-dir", str(data_dir()),
               "--output-dir", str(out), "--overwrite", "--set", f"train.seed={seed}", *extra,
               *(SMOKE if args.smoke else [])]
    if args.nproc > 1:
        command = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   *command]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{task} {extra} seed {seed} failed:\n{done.stderr[-3000:]}")
    return json.loads(results.read_text())["test"]


def metric(test: dict, name: str) -> float:
    if name.startswith("f1 "):
        return test["per_class"][name[3:]]["f1"]
    return test[name]


def table(task: str, scores: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = [f"{task}: test metrics, mean (min-max) over seeds; diff = mean - plain's mean", "",
             "| configuration | " + " | ".join(f"{m} | diff" for m in METRICS[task]) + " |",
             "|---|" + "---|---|" * len(METRICS[task])]
    plain = scores["plain"]
    for name, found in scores.items():
        cells = []
        for m in METRICS[task]:
            values, base = found[m], plain[m]
            mean = statistics.mean(values)
            diff = mean - statistics.mean(base)
            noise = "" if name == "plain" else (
                " (noise)" if min(base) <= mean <= max(base) or min(values) <= statistics.mean(base)
                <= max(values) else "")
            cells += [f"{mean:.4f} ({min(values):.4f}-{max(values):.4f})",
                      "" if name == "plain" else f"{diff:+.4f}{noise}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["trec", "rte"], choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    parser.add_argument("--configs", nargs="+", default=[],
                        help="only these configurations (names as in the table; plain always runs)")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--smoke", action="store_true", help="tiny runs that check the wiring only")
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "finetune")
    args = parser.parse_args()
    unusable = common.check_data_dir(data_dir(), *common.task_folders(*args.tasks),
                                       option=False)
    if unusable:
        sys.exit(unusable)
    if args.smoke:
        args.out = args.out / "smoke"
    report = []
    for task in args.tasks:
        scores: dict[str, dict[str, list[float]]] = {}
        for name, extra in CONFIGS[task]:
            if args.configs and name != "plain" and name not in args.configs:
                continue
            for seed in args.seeds:
                slug = name.split("(")[0].split("=")[0].lower().replace("-", "")
                test = run_one(task, extra, seed, args.out / f"{task}-{slug}-{seed}", args)
                for m in METRICS[task]:
                    scores.setdefault(name, {}).setdefault(m, []).append(metric(test, m))
                print(f"{task} {name} seed {seed}: "
                      + ", ".join(f"{m} {metric(test, m):.4f}" for m in METRICS[task]), flush=True)
        report += [*table(task, scores), ""]
    command = " ".join(["python bench/finetune.py", *sys.argv[1:]])
    print("\n".join([f"`{command}`, {args.nproc} process(es)", "", *report]))


if __name__ == "__main__":
    main()
