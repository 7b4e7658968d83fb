"""Model state per rank, DDP against FSDP2, for a BERT-base-sized model (issue 14). One table.

    python bench/fsdp_memory.py                      # 2 and 4 ranks, ddp and fsdp (a few minutes)
    python bench/fsdp_memory.py --ranks 2 --layers 12 --strategies fsdp

Each rank (spawned, gloo on loopback, 1 thread) builds `BertForSequenceClassification(BertConfig())`
(random init, 110M parameters, fp32), lets nlptrain's strategy place it (DDP: a full replica;
FSDP2: `fully_shard` per BertLayer/BertEmbeddings, then the root), makes the trainer's AdamW, and
takes one optimizer step on a random batch (2 rows of 64 tokens), then measures before zero_grad,
while parameters, gradients and Adam states all exist:
  params/grads/adam   bytes of this rank's tensors (DTensors: the local shard; DDP's gradients
                      are views of its all-reduce buckets: the buckets are counted, once)
  model state         their sum: what ZeRO/FSDP divides by N
  rss peak            VmHWM of the process (torch and transformers included; every rank first
                      builds the whole model on its CPU before it is sharded, and the gathered
                      layers of forward and backward are transient)
Columns show the largest rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MiB = 2**20


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each counted once (DTensors: the local shard)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def rank_main(rank: int, world: int, port: int, strategy: str, layers: int, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from transformers import BertConfig, BertForSequenceClassification

    from nlptrain import TrainConfig, Trainer, distributed

    dist = distributed.from_env(600)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_hidden_layers=layers, num_labels=2))
    total = sum(p.numel() for p in model.parameters())
    trainer = Trainer(model, None, None, config=TrainConfig(strategy=strategy), dist=dist)
    ids = torch.randint(1000, 20000, (2, 64), generator=torch.Generator().manual_seed(rank))
    loss = trainer.model(input_ids=ids, labels=torch.tensor([0, 1])).loss
    loss.backward()
    trainer.optimizer.step()
    params = list(trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.numel() > 1]  # exp_avg, exp_avg_sq (not step)
    row = {"strategy": type(trainer.strategy).__name__, "params": tensor_bytes(params),
           "grads": tensor_bytes([p.grad for p in params if p.grad is not None]),
           "adam": tensor_bytes(state), "rss_peak": common.proc_status_mb("VmHWM") * MiB, "numel": total}
    torch.save(row, Path(out) / f"{strategy}-{world}-{rank}.pt")
    trainer.close()
    dist.close()


def measure(strategy: str, world: int, layers: int, out: Path) -> dict[str, Any]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(rank_main, args=(world, port, strategy, layers, str(out)), nprocs=world,
                       start_method="spawn")
    rows = [torch.load(out / f"{strategy}-{world}-{r}.pt") for r in range(world)]
    largest = {k: max(r[k] for r in rows) for k in ("params", "grads", "adam", "rss_peak")}
    return {**largest, "strategy": rows[0]["strategy"], "numel": rows[0]["numel"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (BERT-base: 12)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import tempfile

    print(f"{'ranks':>5} {'strategy':>8} {'params':>9} {'grads':>9} {'adam':>9} "
          f"{'model state':>11} {'vs ddp':>6} {'rss peak':>9}   (MiB, largest rank)")
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.ranks:
            ddp_state = None
            for strategy in args.strategies:
                r = measure(strategy, world, args.layers, Path(tmp))
                state = r["params"] + r["grads"] + r["adam"]
                ddp_state = state if strategy == "ddp" else ddp_state
                ratio = f"{state / ddp_state:.3f}" if ddp_state else "-"
                print(f"{world:>5} {r['strategy']:>8} {r['params'] / MiB:>9.1f} "
                      f"{r['grads'] / MiB:>9.1f} {r['adam'] / MiB:>9.1f} {state / MiB:>11.1f} "
                      f"{ratio:>6} {r['rss_peak'] / MiB:>9.0f}", flush=True)
    print(f"model: BertForSequenceClassification, {args.layers} layers, "
          f"{r['numel'] / 1e6:.1f}M parameters, fp32; CPU: {common.cpu_model()}")


if __name__ == "__main__":
    main()
