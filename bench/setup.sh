#!/usr/bin/env bash
# Benchmark setup: the README's setup, then the peers (DeepSpeed AutoSP and hand-written
# Ulysses via DeepSpeed / yunchang) as the optional `bench` extra. DeepSpeed's CUDA ops
# are not built (DS_BUILD_OPS=0); its small CPU comm extension is JIT-built into
# bench/.cache on first use (needs g++).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DS_BUILD_OPS=0 .venv/bin/python -m pip -q --disable-pip-version-check install -e '.[test,bench]'
.venv/bin/python -c 'import deepspeed, yunchang; print(f"peers ready: deepspeed {deepspeed.__version__}, yunchang")'
