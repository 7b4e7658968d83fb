"""(a) The loop a user writes by hand from the PyTorch DDP tutorial.

DistributedSampler + set_epoch, DDP, every text padded to max_length once up front, AdamW at a
constant lr, no clipping, no warmup. Test accuracy: a DistributedSampler (which pads the last
ranks with duplicate rows) + all_gather of (index, prediction, label); the duplicates are dropped
by index before counting, so accuracy is exact.

    torchrun --standalone --nproc_per_node 2 bench/tutorial_ddp.py --out /tmp/a
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import common


def main() -> None:
    args = common.contender_parser(__doc__.splitlines()[0]).parse_args()
    job = common.job_of(args)
    rank, world = common.rank_info()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")

    from transformers import AutoModelForSequenceClassification

    split, train_rows, path, tokenizer = common.load_job_data(args)

    def encode(rows: np.ndarray) -> TensorDataset:
        enc = tokenizer(split.texts_of(rows), padding="max_length", truncation=True,
                        max_length=job["max_length"], return_tensors="pt")
        return TensorDataset(torch.arange(len(rows)), enc["input_ids"], enc["attention_mask"],
                             torch.from_numpy(split.labels[rows]))

    train_set, test_set = encode(train_rows), encode(split.test_rows)
    torch.manual_seed(job["seed"])  # the new classifier head is the same on every rank
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).to(device)
    compute = common.ComputeDtype(model)
    ddp_model = DDP(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=job["lr"], fused=cuda or None)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=job["seed"])
    loader = DataLoader(train_set, batch_size=job["batch_size"], sampler=sampler, pin_memory=cuda)
    amp = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16"
           else contextlib.nullcontext())

    clock = common.LoopClock()
    phases = common.Phases()
    for epoch in range(job["epochs"]):
        sampler.set_epoch(epoch)
        ddp_model.train()
        for _, input_ids, mask, labels in loader:
            clock.step_start()
            phases.mark("data")
            input_ids = input_ids.to(device, non_blocking=True)
            mask = mask.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with amp:
                loss = ddp_model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            phases.mark("forward")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            phases.mark("backward")
            optimizer.step()
            phases.mark("optimizer")
            clock.step_end()
    if cuda:  # the last step's kernels may still run
        torch.cuda.synchronize()
        clock.last_end = time.perf_counter()

    # Evaluation: every rank scores its DistributedSampler share, then all_gather.
    dist.barrier()
    start = time.perf_counter()
    eval_sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)
    eval_loader = DataLoader(test_set, batch_size=job["eval_batch_size"], sampler=eval_sampler,
                             pin_memory=cuda)
    module = ddp_model.module
    module.eval()
    found = []
    with torch.no_grad():
        for index, input_ids, mask, labels in eval_loader:
            with amp:
                logits = module(input_ids=input_ids.to(device, non_blocking=True),
                                attention_mask=mask.to(device, non_blocking=True)).logits
            found.append(torch.stack([index.to(device), logits.argmax(-1), labels.to(device)], 1))
    local = torch.cat(found)  # every rank holds len(eval_sampler) rows (padded shares)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    gathered = torch.cat(parts).cpu().numpy()
    eval_s = time.perf_counter() - start
    metrics = common.exact_accuracy(gathered[:, 0], gathered[:, 1], gathered[:, 2],
                                    len(split.test_rows))

    result = {"contender": "a", "train_rows": len(train_rows), "eval_s": eval_s, **clock.as_dict(),
              **metrics, "phases_ms": phases.medians_ms(), "precision": args.precision,
              "compute_dtype": compute.dtype, "device": str(device),
              "threads": torch.get_num_threads(),
              "settings": {"padding": "max_length", "scheduler": "constant", "warmup": 0,
                           "max_grad_norm": 0, "weight_decay": 0.01, "group_by_length": False,
                           "optimizer": "torch.optim.AdamW" + (" fused" if cuda else "")}}
    common.write_result(args.out, result)
    # Clean teardown (DESIGN.md, section 3): drop DDP, collect, then destroy the group.
    del ddp_model, optimizer, module, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
