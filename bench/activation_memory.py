"""Activation checkpointing (`[train] activation_checkpointing`): the memory a training step needs
and its time, with and without, through nlptrain's own Trainer. Prints one table.

    python bench/activation_memory.py                          # MiniLM, 32 x 256, CPU (~2 min)
    python bench/activation_memory.py --model bert-base --batch 16 --seq 512
    python bench/activation_memory.py --batch 64 --seq 128 --precision bf16

Each setting runs in a fresh process (a process's peak memory only grows): the model, its
optimizer and 1 + `--steps` training steps on random rows padded to `--seq` tokens. "training
memory" is the peak over the steps less the memory before the first (the loaded model): on a GPU
torch's peak allocated bytes, on a CPU the peak resident set (VmHWM, reset then). It holds the
gradients and Adam's state, the same in both, and the activations, which checkpointing cuts
(a CPU process keeps freed memory for the next step: measured from the first step, not after
it). "ms/step" is the median of the steps after the first.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import gpu_bench  # noqa: E402


def one_setting(args: argparse.Namespace, checkpointed: bool, queue: mp.Queue) -> None:
    from nlptrain import Callback, TrainConfig, Trainer
    from nlptrain.data import Collator, TokenizedDataset

    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = gpu_bench.make_model(args.model)[0]
    rows = args.batch * (args.steps + 2)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (rows, args.seq), generator=generator).numpy().astype(np.int32)
    data = TokenizedDataset(ids.reshape(-1), np.arange(0, rows * args.seq + 1, args.seq),
                            np.zeros(rows, dtype=np.int64))
    times: list[float] = []
    memory: dict[str, float] = {}

    class Measure(Callback):
        def on_batch_start(self, trainer, batch) -> None:
            if trainer.global_step == 0:  # the model is loaded; gradients and Adam state to come
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    memory["before"] = torch.cuda.memory_allocated() / 2**20
                else:
                    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from here
                    memory["before"] = common.proc_status_mb()
            self.start = time.perf_counter()

        def on_step_end(self, trainer) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            if trainer.global_step > 1:
                times.append(time.perf_counter() - self.start)
            if trainer.global_step == args.steps + 1:
                memory["peak"] = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
                                  else common.proc_status_mb("VmHWM"))
                trainer.should_stop = True

    config = TrainConfig(epochs=1, batch_size=args.batch, precision=args.precision,
                         activation_checkpointing=checkpointed, group_by_length=False,
                         checkpoint_minutes=0)
    trainer = Trainer(model, data, None, config=config, callbacks=[Measure()],
                      collate=Collator(0, pad_to=args.seq))
    trainer.fit()
    queue.put({"memory": memory["peak"] - memory["before"], "ms": 1e3 * statistics.median(times),
               "device": str(device), "precision": trainer.config.precision})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=["minilm", "bert-base"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one untimed)")
    parser.add_argument("--precision", default="fp32", help="fp32 | bf16 | auto")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    found = {}
    for checkpointed in (False, True):
        queue = context.Queue()
        worker = context.Process(target=one_setting, args=(args, checkpointed, queue))
        worker.start()
        found[checkpointed] = queue.get()
        worker.join()
    off, on = found[False], found[True]
    print(f"\n{args.model}, batch {args.batch} x {args.seq} tokens, {off['precision']}, on "
          f"{off['device']} ({common.cpu_model()}, {args.threads} threads), median of {args.steps} "
          "steps\n")
    print("| activation_checkpointing | training memory (MiB) | ms/step |")
    print("|---|---:|---:|")
    for name, row in (("false", off), ("true", on)):
        print(f"| {name} | {row['memory']:.0f} | {row['ms']:.0f} |")
    print(f"\ntrue / false: memory {on['memory'] / off['memory']:.2f}x, "
          f"time {on['ms'] / off['ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
