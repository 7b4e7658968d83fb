"""(c)/(d)/(e) nlptrain, run exactly as `nlptrain train` runs (same parser, same recipe), plus
one callback, the public extension point, that times the loop and the evaluation.

    --config fixed     (c) pad to max_length, no length grouping, constant lr, no warmup, no
                           clipping: the tutorial loop's job, on nlptrain
    --config batching  (d) nlptrain's default batching (dynamic padding, length-grouped batches)
                           on the same job as (a): constant lr, no warmup, no clipping
    --precision bf16   (e) with (d): bf16 autocast
    --config defaults  (f) every nlptrain default: (d) plus linear decay with 10% warmup and
                           clipping at 1.0; with --precision auto (g), the precision default too
    --max-tokens-like-batch  (h) with (d): batches by a token budget of batch_size x the mean
                           tokenized length of the training rows (so as many rows per step on
                           average as (d))
    --attention eager  (i) with (d): transformers' eager attention instead of SDPA (whose fused
                           CPU kernel takes no dropout, so training runs its unfused math path)
    --attention-dropout 0  (j) with (e): no dropout on the attention probabilities, so SDPA
                           runs its fused kernel in training too; a change of the recipe (the
                           checkpoint was pre-trained with 0.1), measured for its accuracy

    torchrun --standalone --nproc_per_node 2 bench/nlptrain_bench.py --out /tmp/d --config defaults
Extra nlptrain options may follow `--`, e.g. `-- --num-workers 1`.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import common

JOB_OPTIMIZER = ["--scheduler", "constant", "--warmup-ratio", "0", "--max-grad-norm", "0"]
CONFIGS = {"fixed": ["--padding", "max_length", "--no-group-by-length", *JOB_OPTIMIZER],
           "batching": JOB_OPTIMIZER, "defaults": []}


def nlptrain_argv(data_dir: Path, output_dir: Path, cache_dir: Path, config: str,
                  precision: str, extra: list[str], seed: int = common.JOB["seed"]) -> list[str]:
    job = {**common.JOB, "seed": seed}
    argv = ["train", "--task", "rt-polarity", "--data-dir", str(data_dir),
            "--output-dir", str(output_dir), "--overwrite", "--log-level", "warning",
            "--set", f"data.cache_dir={cache_dir}",
            "--epochs", str(job["epochs"]), "--batch-size", str(job["batch_size"]),
            "--eval-batch-size", str(job["eval_batch_size"]), "--lr", str(job["lr"]),
            "--max-length", str(job["max_length"]), "--seed", str(job["seed"]),
            "--test-size", str(job["test_size"]), "--split-seed", str(job["split_seed"]),
            "--valid-size", "0", "--precision", precision]
    return argv + CONFIGS[config] + extra


def token_budget_like_batch(split: common.Split, train_rows: int) -> int:
    """batch_size x the mean tokenized length (at max_length) of the rows trained on."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(common.model_path())
    texts = split.texts_of(split.train(train_rows))
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True,
                                              max_length=common.JOB["max_length"])["input_ids"]]
    return round(common.JOB["batch_size"] * float(np.mean(lengths)))


def make_probe(split: common.Split, train_limit: int, attention: str | None = None,
               attention_dropout: float | None = None) -> Any:
    from nlptrain import Callback

    class BenchProbe(Callback):
        """Checks nlptrain holds the shared split, swaps in the --quick rows, times the loop
        (first on_batch_start to last on_batch_end) and the first evaluation."""

        def __init__(self) -> None:
            self.clock = common.LoopClock()
            self.phases = common.Phases()
            self.eval_start: float | None = None
            self.eval_s: float | None = None
            self.metrics: dict = {}
            self.train_rows = 0
            self.precision = ""  # what training runs in ("auto" resolved)
            self.compute: common.ComputeDtype | None = None  # set once the model is final

        def on_train_start(self, trainer: Any) -> None:
            # Fire first in every event, so the marks bracket the built-in callbacks' work.
            listed = getattr(trainer.callbacks, "callbacks", None)
            if isinstance(listed, list) and self in listed:
                listed.remove(self)
                listed.insert(0, self)
            train, test = trainer.train_data, trainer.eval_data
            if not np.array_equal(np.asarray(train.rows), np.sort(split.train_rows)):
                raise RuntimeError("nlptrain's training rows are not bench/common.py's")
            if not np.array_equal(np.asarray(test.rows), split.test_rows):
                raise RuntimeError("nlptrain's test rows are not bench/common.py's")
            for row in split.test_rows[:5]:  # same texts, same tokens
                ids = trainer.tokenizer(split.texts[row], truncation=True,
                                        max_length=common.JOB["max_length"])["input_ids"]
                mine = test.ids[test.offsets[row]:test.offsets[row + 1]]
                if list(ids) != [int(t) for t in mine]:
                    raise RuntimeError(f"row {row}: nlptrain's tokens differ from the tokenizer's")
            if train_limit:
                wanted = split.train(train_limit)
                trainer.train_data = train.select(np.searchsorted(train.rows, wanted))
            self.train_rows = len(trainer.train_data)
            self.precision = trainer.config.precision
            self.compute = common.ComputeDtype(trainer.unwrapped_model)
            if attention:  # read by every attention layer at each forward
                trainer.unwrapped_model.set_attn_implementation(attention)
            if attention_dropout is not None:  # transformers' BERT-style self-attention modules
                layers = [m for m in trainer.unwrapped_model.modules()
                          if type(m).__name__.endswith("SelfAttention")]
                if not layers:
                    raise RuntimeError("--attention-dropout: no *SelfAttention module found")
                for layer in layers:
                    layer.dropout.p = attention_dropout

        def on_batch_start(self, trainer: Any, batch: dict) -> None:
            self.clock.step_start()
            self.phases.mark("data")  # also the previous step's tail: loss check, stop flag

        def on_loss(self, trainer: Any, loss: Any) -> None:
            self.phases.mark("forward")

        def on_backward_end(self, trainer: Any) -> None:
            self.phases.mark("backward")

        def on_step_end(self, trainer: Any) -> None:
            self.phases.mark("clip+loss all-reduce+optimizer")

        def on_batch_end(self, trainer: Any) -> None:
            self.phases.mark("scheduler+callbacks")
            self.clock.step_end()

        def on_valid_start(self, trainer: Any) -> None:
            if self.eval_start is not None:
                return
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
                self.clock.last_end = time.perf_counter()
            trainer.dist.barrier()
            self.eval_start = time.perf_counter()

        def on_valid_end(self, trainer: Any, metrics: dict, is_best: bool) -> None:
            if self.eval_s is None:
                self.eval_s = time.perf_counter() - self.eval_start
                self.metrics = {k: metrics[k] for k in ("correct", "rows", "accuracy")}

    return BenchProbe()


def main() -> None:
    parser = common.contender_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="batching")
    parser.add_argument("--cache-dir", type=Path, default=common.BENCH_DIR / ".cache" / "tokens",
                        help="nlptrain token cache (filled by the first run, then reused)")
    parser.add_argument("--max-tokens-like-batch", action="store_true",
                        help="--max-tokens = batch_size x the mean tokenized training row")
    parser.add_argument("--attention", choices=["sdpa", "eager"],
                        help="the model's attention implementation (default: transformers')")
    parser.add_argument("--attention-dropout", type=float,
                        help="dropout on the attention probabilities (default: the model's)")
    parser.add_argument("extra", nargs="*", help="more nlptrain train options, after --")
    args = parser.parse_args()
    rank, _ = common.rank_info()
    data_dir = args.data_dir or common.default_data_dir()
    output_dir = Path(f"{args.out}.run")

    from nlptrain import cli, recipe

    split = common.load_split(data_dir)
    extra = list(args.extra)
    if args.max_tokens_like_batch:
        extra += ["--max-tokens", str(token_budget_like_batch(split, args.train_rows))]
    argv = nlptrain_argv(data_dir, output_dir, args.cache_dir, args.config, args.precision,
                         extra, args.seed)
    parsed = cli.build_parser().parse_args(argv)
    task = cli.resolve_task(parsed)
    probe = make_probe(split, args.train_rows, args.attention, args.attention_dropout)
    opts = cli.run_options(parsed)  # exactly what `nlptrain train` would run with...
    opts.callbacks.insert(0, probe)  # ...plus the probe
    with recipe.backend(task.train.timeout) as dist:
        cli.start_logging(parsed, dist.rank)
        recipe.train(task, opts, dist)
        device = str(dist.device)
    if probe.metrics.get("rows") != len(split.test_rows):
        raise RuntimeError(f"evaluated {probe.metrics.get('rows')} rows, "
                           f"expected {len(split.test_rows)}")
    t = task.train
    key = {"fixed": "c", "batching": "d", "defaults": "f"}[args.config]
    result = {"contender": "e" if key == "d" and args.precision == "bf16" else key,
              "config": args.config,
              "train_rows": probe.train_rows, "eval_s": probe.eval_s, **probe.clock.as_dict(),
              **probe.metrics, "phases_ms": probe.phases.medians_ms(),
              "precision": args.precision, "precision_chosen": probe.precision,
              "compute_dtype": probe.compute.dtype if probe.compute else "",
              "device": device, "attention": args.attention,
              "attention_dropout": args.attention_dropout,
              "threads": torch.get_num_threads(), "argv": argv,
              "settings": {"padding": t.padding, "group_by_length": t.group_by_length,
                           "scheduler": t.scheduler, "warmup": t.warmup_ratio,
                           "max_grad_norm": t.max_grad_norm, "weight_decay": t.weight_decay,
                           "optimizer": "torch.optim.AdamW (nlptrain)"}}
    common.write_result(args.out, result)
    if rank == 0:
        shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
