"""Training throughput and MFU on one GPU: MiniLM and a BERT-base-sized random-init model, seq 128,
in three loops side by side (bench/gpu_loops.py): the bare hand-written step, nlptrain's own loop
(`Trainer.fit`), and `transformers.Trainer`.

Every loop does the same work: bf16 autocast, fused AdamW, pinned host memory, batches of
rt-polarity rows padded to --seq tokens (random token ids when the data is not there), no
clipping. Each (model, batch, loop) runs --warmup untimed steps, then --steps timed ones between
two cuda synchronizations. "vs bare" is the loop's samples/s over the bare step's (the cost of
the library around the same step); the last lines give nlptrain / transformers.Trainer.

FLOP convention (PaLM, appendix B): training FLOPs per token = 6 x N + 12 x L x S x d, with N the
non-embedding parameters (embedding lookups are not matmuls), L layers, S the sequence length
and d the hidden size (attention scores and values). "MFU" counts every padded token (what the
GPU computes); "useful MFU" counts only the real, non-padding tokens; "MFU 6PT" is the simple
6 x all parameters x padded tokens. Peak: dense bf16 tensor-core TFLOP/s of the detected GPU
(table below; --peak-tflops to set it).

    python bench/gpu_bench.py                    # on a GPU, well under 5 minutes
    python bench/gpu_bench.py --dry-run          # on CPU: 2 steps of small batches, checks the code
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import gpu_loops  # noqa: E402

# Dense (no sparsity) bf16 tensor TFLOP/s; the first matching substring of the lowercased name
# wins, so more specific names come first.
PEAK_TFLOPS = [
    ("gh200", 989.0), ("h200", 989.0), ("h100 pcie", 756.0), ("h100 nvl", 835.0),
    ("h100", 989.0), ("h800", 989.0), ("b200", 2250.0), ("b100", 1750.0),
    ("a100", 312.0), ("a800", 312.0), ("l40s", 362.0), ("l4", 121.0),
    ("rtx 4090", 165.0), ("a6000", 155.0), ("v100", 125.0), ("t4", 65.0),  # V100/T4: fp16
]


LOOP_NAMES = {"bare": "bare step", "nlptrain": "nlptrain Trainer.fit", "hf": "transformers.Trainer",
              "bare+compile": "bare step, compiled", "nlptrain+compile": "nlptrain, compile = true"}


def peak_tflops(name: str) -> float | None:
    lower = name.lower()
    for key, value in PEAK_TFLOPS:
        if key in lower:
            return value
    return None


def load_rows(data_dir: Path, rows: int, seq: int) -> tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor, str]:
    """Token ids, attention mask and labels of the --quick rows, padded to `seq`."""
    try:
        from transformers import AutoTokenizer

        split = common.load_split(data_dir)
        picked = split.train(rows)
        tokenizer = AutoTokenizer.from_pretrained(common.model_path())
        enc = tokenizer(split.texts_of(picked), padding="max_length", truncation=True,
                        max_length=seq, return_tensors="pt")
        return (enc["input_ids"], enc["attention_mask"],
                torch.from_numpy(split.labels[picked]), "rt-polarity")
    except Exception as err:  # no data or no MiniLM package: random ids, every token real
        print(f"note: random token ids ({type(err).__name__}: {err})", flush=True)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, 30000, (rows, seq), generator=generator)
        return ids, torch.ones_like(ids), torch.randint(0, 2, (rows,), generator=generator), \
            "random ids"


def make_model(name: str):
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    if name == "minilm":
        try:
            return AutoModelForSequenceClassification.from_pretrained(
                common.model_path(), num_labels=2), "MiniLM-L6 (pretrained)"
        except Exception as err:
            print(f"note: MiniLM package missing ({err}); random init of the same shape")
            config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                intermediate_size=1536, num_labels=2)
            return BertForSequenceClassification(config), "MiniLM-L6 shape (random init)"
    if name == "bert-base":
        return BertForSequenceClassification(BertConfig(num_labels=2)), "BERT-base (random init)"
    raise SystemExit(f"unknown model {name}")


def flops_per_token(model, seq: int) -> tuple[float, float, int, int]:
    """(PaLM training FLOPs per token, 6 x all params, all params, non-embedding params)."""
    total = sum(p.numel() for p in model.parameters())
    embed = sum(p.numel() for n, p in model.named_parameters() if ".embeddings." in f".{n}")
    cfg = model.config
    palm = 6 * (total - embed) + 12 * cfg.num_hidden_layers * seq * cfg.hidden_size
    return palm, 6.0 * total, total, total - embed


def bench_one(name: str, batch: int, loop: str, args: argparse.Namespace, data, device, dtype,
              peak: float | None) -> dict:
    torch.manual_seed(0)
    model, label = make_model(name)
    model.to(device).train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = gpu_loops.LOOPS[loop](model, data, batch, args.warmup, args.steps, device, dtype)
    palm, simple, total, non_embed = flops_per_token(model, args.seq)
    samples_s = args.steps * batch / seconds
    tokens_s = samples_s * args.seq
    real_s = tokens_s * float(data[1].float().mean())  # every loop samples the same rows at random
    tflops = palm * tokens_s / 1e12
    return {"model": label, "loop": loop, "params_m": total / 1e6, "non_embed_m": non_embed / 1e6,
            "batch": batch, "seq": args.seq, "samples_s": samples_s, "tokens_s": tokens_s,
            "real_tokens_s": real_s, "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "useful_mfu": palm * real_s / 1e12 / peak if peak else None,
            "mfu_6pt": simple * tokens_s / 1e12 / peak if peak else None,
            "mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="minilm,bert-base")
    p.add_argument("--batch-sizes", default="16,256",
                   help="per-GPU batches: 16 is the benchmark's job, 256 fills the GPU")
    p.add_argument("--loops", default="bare,nlptrain,hf",
                   help="bare (the hand-written step), nlptrain (Trainer.fit), hf (transformers.Trainer)")
    p.add_argument("--compiled-at", default="bert-base:256",
                   help="MODEL:BATCH,...: where the bare and nlptrain loops also run under "
                   "torch.compile ('': nowhere; each compile takes tens of seconds)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rows", type=int, default=common.QUICK_ROWS, help="rt-polarity rows to cycle")
    p.add_argument("--data-dir", type=Path, default=common.default_data_dir())
    p.add_argument("--peak-tflops", type=float, help="override the detected peak")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--time-budget", type=float, default=240,
                   help="skip the remaining configurations after this many seconds")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of the code: 2 timed steps, batches 4")
    args = p.parse_args()
    if args.dry_run:
        args.device, args.steps, args.warmup, args.batch_sizes = "cpu", 2, 1, "4"
        args.rows, args.seq, args.precision = min(args.rows, 64), 32, "fp32"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    begin = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        name = "CPU"
    peak = args.peak_tflops or (peak_tflops(name) if device.type == "cuda" else None)
    dtype = None
    if args.precision == "bf16":
        bf16_ok = device.type != "cuda" or torch.cuda.is_bf16_supported()
        dtype = torch.bfloat16 if bf16_ok else torch.float16
    data = load_rows(args.data_dir, args.rows, args.seq)
    real_frac = float(data[1].float().mean())
    print(f"device: {name}; peak {peak or 'unknown (pass --peak-tflops)'} TFLOP/s dense; "
          f"autocast {dtype}; data {data[3]} ({args.rows} rows, {real_frac:.1%} of the "
          f"{args.seq} positions are real tokens); torch {torch.__version__}", flush=True)
    results = []
    loops = args.loops.split(",")
    compiled_at = {tuple(pair.split(":")) for pair in args.compiled_at.split(",") if pair}
    for model_name in args.models.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            compiled = [f"{loop}+compile" for loop in loops if loop in ("bare", "nlptrain")
                        and (model_name, str(batch)) in compiled_at]
            for loop in loops + compiled:  # side by side: the same model, rows and batch
                if time.perf_counter() - begin > args.time_budget:
                    print(f"time budget spent: skipping {model_name} batch {batch} {loop}")
                    continue
                try:
                    r = bench_one(model_name, batch, loop, args, data, device, dtype, peak)
                except torch.cuda.OutOfMemoryError:
                    print(f"{model_name} batch {batch} {loop}: out of memory, skipped")
                    torch.cuda.empty_cache()
                    continue
                results.append(r)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(f"{r['model']} batch {batch} {loop}: {r['samples_s']:.1f} samples/s", flush=True)
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    print("\n| model | loop | params M (non-emb) | batch x seq | samples/s | vs bare | TFLOP/s | MFU |"
          " useful MFU | MFU 6PT | peak mem GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    # "vs bare": against the bare step compiled alike (eager loops against the eager step)
    bare = {(r["model"], r["batch"], r["loop"].endswith("+compile")): r["samples_s"]
            for r in results if r["loop"] in ("bare", "bare+compile")}
    for r in results:
        mem = "-" if r["mem_gb"] is None else f"{r['mem_gb']:.1f}"
        base = bare.get((r["model"], r["batch"], r["loop"].endswith("+compile")))
        ratio = f"{r['samples_s'] / base:.3f}" if base else "-"
        print(f"| {r['model']} | {LOOP_NAMES[r['loop']]} | {r['params_m']:.1f} ({r['non_embed_m']:.1f}) | "
              f"{r['batch']} x {r['seq']} | {r['samples_s']:.1f} | {ratio} | "
              f"{r['tflops']:.3g} | {pct(r['mfu'])} | {pct(r['useful_mfu'])} | "
              f"{pct(r['mfu_6pt'])} | {mem} |")
    by = {(r["model"], r["batch"], r["loop"]): r["samples_s"] for r in results}
    for (model, batch, loop), speed in by.items():
        if loop == "nlptrain" and (model, batch, "hf") in by:
            print(f"{model} batch {batch}: nlptrain / transformers.Trainer = "
                  f"{speed / by[(model, batch, 'hf')]:.2f}x")
    print(f"\nMFU = (6 x non-embedding params + 12 x layers x seq x hidden) x padded tokens/s / "
          f"peak; useful MFU counts real tokens only; MFU 6PT = 6 x all params x padded tokens/s "
          f"/ peak. {args.steps} timed steps after {args.warmup} warm-up steps; "
          f"{time.perf_counter() - begin:.0f} s in all.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
