#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with a CPU (or, where a GPU
# exists, the default) torch, torch-mlir and autosp installed editable with test tools.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; assert sys.version_info >= (3, 10), "autosp needs Python >= 3.10"'
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
# --no-compile: pip would byte-compile every file of torch (about a minute on 2 cores) where
# a run imports a fraction of them; Python compiles those at first import instead (below,
# and in scripts/test.sh, with bytecode writing on even where PYTHONDONTWRITEBYTECODE is set).

if ! .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith(("2.13", "2.14")) else 1)' 2>/dev/null; then
  # Prefer a CPU wheel already on this machine (pip's find-links folder); its dependencies
  # come from the package index. Never let pip resolve a CUDA torch on a CPU machine.
  LOCAL_WHEEL=$(ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$LOCAL_WHEEL" ]; then
    "${PIP[@]}" install --no-compile "$LOCAL_WHEEL"
  elif ! "${PIP[@]}" install --no-compile --no-index torch==2.13.0 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
      "${PIP[@]}" install --no-compile torch==2.13.0
    else
      "${PIP[@]}" install --no-compile torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
# torch is already satisfied, so this installs torch-mlir, numpy and the test tools only.
"${PIP[@]}" install --no-compile -e '.[test]'
# autosp.titan's tests: torchtitan 0.3.0 pins packages the test tools need newer (datasets),
# so it comes without its dependencies, then the ones its models import (its model registry
# imports triton, ~290 MB; on a CPU machine nothing runs it).
if ! .venv/bin/python -c 'import torchtitan, triton, tyro, spmd_types, einops, torch_checkpointing, tensorboard, torchdata' 2>/dev/null; then
  "${PIP[@]}" install --no-compile --no-deps 'torchtitan==0.3.0'
  "${PIP[@]}" install --no-compile -e '.[titan]'
fi
# torchtitan's Qwen3.5 module imports fla (flash-linear-attention: Python, its kernels Triton,
# CUDA-only). It goes into .venv/fla, not among the venv's packages: with fla importable,
# transformers' Qwen3-Next calls fla's kernels even on CPU. Only test_titan_deltanet's ranks
# (fresh processes) put it on their path.
if [ ! -d .venv/fla/fla ]; then
  "${PIP[@]}" install --no-compile --no-deps --target .venv/fla 'flash-linear-attention==0.6.0' 'fla-core==0.6.0'
fi
PYTHONDONTWRITEBYTECODE= .venv/bin/python -c 'import torch, torch_mlir, transformers, autosp.api, autosp; print(f"autosp {autosp.__version__}: torch {torch.__version__}, torch-mlir ready")'
