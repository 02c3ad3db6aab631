#!/usr/bin/env bash
# Run every test: the lit compiler tests, then pytest. Fails if any test fails or none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
start=$(date +%s)

echo "== lit (compiler tests)"
lit_out=$(lit -sv lit_tests 2>&1); lit_rc=$?
echo "$lit_out" | tail -n 40
if ! echo "$lit_out" | grep -Eq "(Passed|Total Discovered Tests): *[1-9]"; then
  echo "lit ran no test"; lit_rc=1
fi

echo "== pytest"
python -m pytest -q python_tests "$@"; py_rc=$?
[ $py_rc -eq 5 ] && echo "pytest ran no test"

echo "== suite time: $(( $(date +%s) - start ))s (lit rc=$lit_rc, pytest rc=$py_rc)"
[ $lit_rc -eq 0 ] && [ $py_rc -eq 0 ]
