#!/usr/bin/env bash
# torch's own test_dataloader.py with fastcollate swapped in (../shared/torch_suite, read there,
# never copied here). A failure counts only if it fails again when rerun alone AND the same test
# passes on stock torch: the suite's own README warns that a few tests can time out on 2 cores.
#   .ci/torch_suite.sh loader|collate
set -uo pipefail
mode=${1:?usage: torch_suite.sh loader|collate}
suite="$(cd "$(dirname "$0")/.." && pwd)/../shared/torch_suite/run.sh"
[[ -x $suite || -f $suite ]] || { echo "torch_suite: $suite not found"; exit 1; }
log=$(mktemp)
bash "$suite" "$mode" 2>&1 | tee "$log" | grep -E "passed|failed|^FAILED|^ERROR" || true
failed=$(grep -E "^(FAILED|ERROR) test_dataloader.py::" "$log" | sed -E 's/^(FAILED|ERROR) test_dataloader.py::([A-Za-z0-9_]+)::([A-Za-z0-9_]+).*/(\2 and \3)/' | sort -u)
[[ -z $failed ]] && { grep -qE "[0-9]+ passed" "$log" && exit 0; echo "torch_suite: no result"; exit 1; }
expr=$(echo "$failed" | paste -sd'|' | sed 's/|/ or /g')
echo "torch_suite ($mode): rerunning alone: $expr"
bash "$suite" "$mode" -k "$expr" 2>&1 | tee "$log" | grep -E "passed|failed|^FAILED" || true
again=$(grep -E "^(FAILED|ERROR) test_dataloader.py::" "$log" | sed -E 's/^(FAILED|ERROR) test_dataloader.py::([A-Za-z0-9_]+)::([A-Za-z0-9_]+).*/(\2 and \3)/' | sort -u)
[[ -z $again ]] && exit 0
expr=$(echo "$again" | paste -sd'|' | sed 's/|/ or /g')
echo "torch_suite ($mode): still failing, checking them on stock torch: $expr"
bash "$suite" stock -k "$expr" 2>&1 | tee "$log" | grep -E "passed|failed|^FAILED" || true
stock_failed=$(grep -E "^(FAILED|ERROR) test_dataloader.py::" "$log" | sed -E 's/^(FAILED|ERROR) test_dataloader.py::([A-Za-z0-9_]+)::([A-Za-z0-9_]+).*/(\2 and \3)/' | sort -u)
regressions=$(comm -23 <(echo "$again") <(echo "$stock_failed"))
if [[ -n $regressions ]]; then
  echo "torch_suite ($mode): REGRESSIONS (pass on stock torch, fail with fastcollate): $regressions"
  exit 1
fi
echo "torch_suite ($mode): the remaining failures fail on stock torch too: $again"
