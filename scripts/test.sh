#!/usr/bin/env bash
# Run every test: static checks (ruff, mypy), the lit compiler tests, then pytest. Fails if any test fails or none ran.
#   scripts/test.sh [pytest args]   everything: python_tests/unit (in-process, seconds) and python_tests/e2e
#                                   (whole models compiled, gloo ranks spawned)
#   scripts/test.sh --quick         static checks and python_tests/unit only (about half a minute)
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
export PATH="$PWD/.venv/bin:$PATH"
# Cache bytecode as modules are first imported (setup installs without compiling everything).
export PYTHONDONTWRITEBYTECODE=
start=$(date +%s)

echo "== static checks (ruff, mypy)"
static_rc=0
ruff check . || static_rc=1
mypy autosp passes || static_rc=1

if [ $QUICK -eq 1 ]; then
  echo "== pytest (unit)"
  python -m pytest -q -n "${AUTOSP_TEST_WORKERS:-2}" python_tests/unit "$@"; py_rc=$?
  echo "== quick suite time: $(( $(date +%s) - start ))s (static rc=$static_rc, pytest rc=$py_rc)"
  [ $static_rc -eq 0 ] && [ $py_rc -eq 0 ]
  exit
fi

echo "== lit (compiler tests)"
lit_start=$(date +%s)
lit_out=$(lit -sv lit_tests 2>&1); lit_rc=$?
echo "$lit_out" | tail -n 40
if ! echo "$lit_out" | grep -Eq "(Passed|Total Discovered Tests): *[1-9]"; then
  echo "lit ran no test"; lit_rc=1
fi

echo "== lit time: $(( $(date +%s) - lit_start ))s"

echo "== pytest"
# Every process that compiles appends a line per model to one compile log (autosp/compile_log.py);
# its summary after the run says how much of the suite was tracing.
own_log=0
if [ -z "${AUTOSP_COMPILE_LOG:-}" ]; then export AUTOSP_COMPILE_LOG=$(mktemp -t autosp-compiles-XXXXXX.jsonl); own_log=1; fi
# Two pytest workers: a parity test's ranks wait while its first rank compiles for the
# group, so one test at a time leaves a core idle. Parity tests reuse their spawned gloo
# ranks between tests (AUTOSP_RANK_POOL) and share one import cache (AUTOSP_CACHE_DIR; see
# python_tests/conftest.py). The slowest tests are listed so a slow new one is noticed.
python -m pytest -q -n "${AUTOSP_TEST_WORKERS:-2}" --dist worksteal --durations=15 python_tests "$@"; py_rc=$?
[ $py_rc -eq 5 ] && echo "pytest ran no test"
python -m autosp.compile_log "$AUTOSP_COMPILE_LOG" || true
[ $own_log -eq 1 ] && rm -f "$AUTOSP_COMPILE_LOG"

echo "== suite time: $(( $(date +%s) - start ))s (static rc=$static_rc, lit rc=$lit_rc, pytest rc=$py_rc)"
[ $static_rc -eq 0 ] && [ $lit_rc -eq 0 ] && [ $py_rc -eq 0 ]
