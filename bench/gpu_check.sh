#!/usr/bin/env bash
# The GPU check: what a CPU-only machine cannot test, run on a machine with one NVIDIA GPU in
# under 8 minutes, with a report written to bench/reports/gpu-DATE-HOST.md. Whoever works on a
# machine with a GPU runs it there first and commits the report (CONTRIBUTING.md):
#
#   bench/gpu_check.sh
#
# Steps, each under its own time limit, 470 s in all (the report gives each one's status, seconds and the tail
# of its output; the script exits 1 if any failed):
#   doctor     distlab doctor
#   test_gpu   tests/test_gpu.py (NCCL on one rank, "auto", CUDA tensors back from ranks, traces,
#              DDP and DTensor on a GPU, the grader's both backends)
#   labs       every lab's solution, top to bottom, as a student with one GPU runs it: backend
#              "auto" (NCCL where each rank has a GPU: world size 1; gloo for 2 and 4 ranks) and
#              its checks under --backend both (NCCL too wherever the world size is 1)
#   busbw      the bandwidth sweep on NCCL under torchrun (one rank: NCCL's own path, to 1 GiB)
#   train3d    Lab 7's run on NCCL at world size 1, its losses against single-process training
#   grade      one sample (Lab 1 solved) graded with --backend both
# Where no GPU is, it says so and exits at once (status 0, no report).
set -uo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check, no report written."
    exit 0
fi

cd "$(dirname "$0")/.." || exit 1
PYTHON=${PYTHON:-.venv/bin/python}
[[ $PYTHON == /* ]] || PYTHON=$PWD/$PYTHON   # the labs run in folders of their own
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if (( gpus < 1 )); then
    echo "gpu_check: nvidia-smi lists a GPU but torch sees none ($("$PYTHON" -c 'import torch; print(torch.__version__)')):" \
         "a CPU build of torch? Install the CUDA build (pip install torch==2.13.0) and run it again." >&2
    exit 1
fi

mkdir -p bench/reports
stamp=$(date -u +%Y-%m-%d-%H%M)
report="bench/reports/gpu-$stamp-$(hostname -s).md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
declare -a rows=()
failed=0

# step NAME LIMIT COMMAND...: run COMMAND under LIMIT seconds; its output in $work/NAME.log.
step() {
    local name=$1 limit=$2 t0=$SECONDS status
    shift 2
    echo "gpu_check: $name ..."
    timeout --kill-after=10 "$limit" "$@" >"$work/$name.log" 2>&1
    status=$?
    local word=ok
    if (( status == 124 || status == 137 )); then word="timed out after ${limit} s"; failed=1
    elif (( status != 0 )); then word="FAILED (exit $status)"; failed=1; fi
    rows+=("| $name | $word | $(( SECONDS - t0 )) |")
    echo "gpu_check: $name: $word ($(( SECONDS - t0 )) s)"
}

labs() {   # every lab's solution script, five at a time, each in its own folder of $work
    ls solutions/*/[0-9]*.py | xargs -P 5 -I{} bash -c '
        lab=$(basename {} .py); mkdir -p "$0/$lab"
        if (cd "$0/$lab" && MPLBACKEND=Agg DISTLAB_BACKEND=both timeout 170 \
                "$1" "$2/{}" >"$0/$lab.out" 2>&1); then echo "$lab ok"
        else echo "$lab FAILED:"; tail -n 15 "$0/$lab.out"; exit 1; fi' "$work/labs" "$PYTHON" "$PWD"
}

grade_sample() {   # Lab 1 solved, graded on gloo and NCCL
    "$PYTHON" - "$work/grade" <<'EOF' || return 1
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import submissions
submissions.write(submissions.solved("01_collectives"), Path(sys.argv[1], "submitted"), "alice",
                  "01_collectives")
EOF
    "$PYTHON" -m distlab.cli grade "$work/grade/submitted" --backend both --jobs 1 \
        --workdir "$work/grade/grading" --out "$work/grade/scores.csv" || return 1
    cat "$work/grade/scores.csv"
    "$PYTHON" - "$work/grade/scores.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows and all(r["score"] == r["max_score"] != "0" for r in rows), rows
print("full marks on gloo and NCCL")
EOF
}

mkdir -p "$work/labs"
export -f labs grade_sample   # `timeout` runs programs: these two run as `bash -c NAME`
export work PYTHON
step doctor 30 "$PYTHON" -m distlab.cli doctor
step test_gpu 100 "$PYTHON" -m pytest -q -n 0 -p no:cacheprovider tests/test_gpu.py
step labs 180 bash -c labs
step busbw 40 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=1 \
    -m distlab.cluster.busbw --backend nccl
step train3d 40 "$PYTHON" -m distlab.cluster.train3d --backend nccl --nproc 1 --tp 1 --pp 1
step grade 80 bash -c grade_sample

{
    echo "# GPU check, $stamp UTC, $(hostname -s)"
    echo
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
    echo "- torch $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))')"
    echo "- commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "- $(( SECONDS - start )) s in all; bench/gpu_check.sh"
    echo
    echo "| step | result | seconds |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
    for log in doctor test_gpu labs busbw train3d grade; do
        echo
        echo "## $log"
        echo
        echo '```text'
        tail -n 60 "$work/$log.log"
        echo '```'
    done
} >"$report"
echo "gpu_check: report written to $report ($(( SECONDS - start )) s)"
exit $failed
