"""(b) transformers.Trainer as its documentation recommends for text classification.

Tokenize with truncation only, DataCollatorWithPadding (dynamic padding), Trainer's defaults for
the rest (AdamW `adamw_torch_fused`, linear decay without warmup, max_grad_norm 1.0, weight decay
0), plus two settings a user is pointed to: `train_sampling_strategy="group_by_length"`
(transformers 5.x's name for the old `group_by_length=True`; off with --no-group-by-length) and
`ddp_find_unused_parameters=False` (DDP's own warning asks for it). There is no `datasets` package
here, so the data is a plain list of tokenized dicts (a torch Dataset), which Trainer accepts.

    torchrun --standalone --nproc_per_node 2 bench/hf_trainer.py --out /tmp/b
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

import common


class Rows(Dataset):
    def __init__(self, features: list[dict]) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict:
        return self.features[i]


def main() -> None:
    parser = common.contender_parser(__doc__.splitlines()[0])
    parser.add_argument("--no-group-by-length", action="store_true",
                        help="plain random sampling instead of length-grouped batches")
    args = parser.parse_args()
    job = common.job_of(args)
    rank, world = common.rank_info()
    cuda = torch.cuda.is_available()

    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    split, train_rows, path, tokenizer = common.load_job_data(args)

    def encode(rows: np.ndarray) -> Rows:
        enc = tokenizer(split.texts_of(rows), truncation=True, max_length=job["max_length"])
        labels = split.labels[rows]
        return Rows([{**{k: enc[k][i] for k in enc.keys()}, "labels": int(labels[i])}
                     for i in range(len(rows))])

    train_set, test_set = encode(train_rows), encode(split.test_rows)
    torch.manual_seed(job["seed"])
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    compute = common.ComputeDtype(model)
    clock = common.LoopClock()
    phases = common.Phases()

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.step_start()
            phases.mark("data")

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            phases.mark("forward+backward+clip")

        def on_optimizer_step(self, args, state, control, **kwargs):
            phases.mark("optimizer")

        def on_step_end(self, args, state, control, **kwargs):
            phases.mark("scheduler+zero_grad")
            clock.step_end()

    def accuracy(prediction) -> dict:
        predicted = np.asarray(prediction.predictions).argmax(-1)
        labels = np.asarray(prediction.label_ids)
        correct = int((predicted == labels).sum())
        return {"correct": correct, "rows": int(len(labels))}

    output_dir = tempfile.mkdtemp(prefix="hf-bench-") if rank == 0 else None
    training_args = TrainingArguments(
        output_dir=output_dir or os.path.join(tempfile.gettempdir(), "hf-bench-unused"),
        num_train_epochs=job["epochs"],
        per_device_train_batch_size=job["batch_size"],
        per_device_eval_batch_size=job["eval_batch_size"],
        learning_rate=job["lr"],
        seed=job["seed"],
        train_sampling_strategy="random" if args.no_group_by_length else "group_by_length",
        bf16=args.precision == "bf16",
        use_cpu=not cuda,
        ddp_backend=None if cuda else "gloo",
        # Trainer's default (None) turns find_unused_parameters on for every PreTrainedModel, and
        # DDP then warns on every rank that it costs an extra graph traversal per step and should
        # be turned off. A user who reads that warning sets it off, so (b) does.
        ddp_find_unused_parameters=False,
        dataloader_pin_memory=cuda,
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=False,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set,
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
                      compute_metrics=accuracy, callbacks=[Clock()])
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
        clock.last_end = time.perf_counter()

    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    metrics = trainer.evaluate(test_set)
    eval_s = time.perf_counter() - start
    rows, correct = int(metrics["eval_rows"]), int(metrics["eval_correct"])
    if rows != len(split.test_rows):
        raise RuntimeError(f"Trainer.evaluate scored {rows} rows, expected {len(split.test_rows)}")

    result = {"contender": "b", "train_rows": len(train_rows), "eval_s": eval_s,
              **clock.as_dict(), "correct": correct, "rows": rows, "accuracy": correct / rows,
              "phases_ms": phases.medians_ms(),
              "precision": args.precision, "compute_dtype": compute.dtype,
              "device": str(training_args.device),
              "threads": torch.get_num_threads(),
              "settings": {"padding": "dynamic (DataCollatorWithPadding)",
                           "train_sampling_strategy": training_args.train_sampling_strategy,
                           "scheduler": str(training_args.lr_scheduler_type),
                           "warmup": training_args.warmup_steps,
                           "max_grad_norm": training_args.max_grad_norm,
                           "weight_decay": training_args.weight_decay,
                           "optimizer": str(training_args.optim),
                           "ddp_find_unused_parameters": False}}
    common.write_result(args.out, result)
    del trainer, model
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    if output_dir:
        shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
