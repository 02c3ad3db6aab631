#!/usr/bin/env bash
# The GPU check, one command, under 8 minutes on one H200:
#     bash bench/gpu_check.sh [--seqs 16384 32768 65536] [--size 1b]
# Every attention kind on CUDA's kernels against fp64 eager attention (forward + backward,
# bf16 and fp32, the kernel each ran), parity on CUDA at sp_size=1 (checkpointing off /
# sac / full), step time and torch.cuda.max_memory_allocated for a ~1B Llama at three
# lengths with the CUDA memory model's prediction beside each; see bench/gpu_check.py. Uses the machine's python3 with
# its CUDA PyTorch and the repository on PYTHONPATH (no virtual environment: a GPU
# machine's torch must not be replaced by the CPU wheel). torch-mlir comes from carried
# wheels in .whl/ when the machine has no package index. The table lands in
# $OUT/gpu_check.md (or bench/gpu_check.md); copy it into bench/RESULTS.md with its date.
# Then the memory_budget check (8B at 32K / 64K / 128K: tokens/s, measured peak vs the
# CUDA memory model) into gpu_budget_check.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch_mlir' 2>/dev/null; then
  if ls .whl/torch_mlir-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps --no-index .whl/*.whl
  else
    "$PY" -m pip install -q --no-deps torch-mlir==20261001
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 200 "$PY" bench/gpu_check.py --out "${OUT:-bench}/gpu_check.md" "$@"
# memory_budget: an 8B-shaped Llama (random weights) on one GPU with the tiled loss, full
# recompute, tiled MLP and offload: measured peak against the memory model, and step time.
timeout 220 "$PY" bench/gpu_check.py --seqs --budget-size 8b --budget-seqs ${BUDGET_SEQS:-32768 65536 131072} \
  --out "${OUT:-bench}/gpu_budget_check.md" || echo "memory_budget check failed (see above)"
NGPU=$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))')
timeout 60 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" bench/gpu_fsdp_check.py \
  --out "${OUT:-bench}/gpu_check.md"
