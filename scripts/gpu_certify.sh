#!/usr/bin/env bash
# Certify, on one CUDA GPU, every backend that needs one: torch's SDPA kernels (torch,
# torch-math, torch-flash, torch-efficient, torch-cudnn), torch-flex, jax and jax-cudnn,
# and the prepared GPU adapters flashinfer, vllm-flash and torch-context-parallel
# (written without a GPU: unverified until this script has run). Quick profile; each
# step writes REPORTS/NAME.json, NAME.md and NAME.log, then REPORTS gets the matrix and
# summary.txt. Where $OUT names another folder (a device machine's, which returns a few
# files), summary.txt, gpu.txt, matrix.md and REPORTS as gpu-reports.tar.gz go there too.
#
#   bash scripts/gpu_certify.sh [REPORTS]          certify (default REPORTS: reports/gpu)
#   bash scripts/gpu_certify.sh --install-only     install from the wheelhouse, nothing else
#   bash scripts/gpu_certify.sh --check [REPORTS]  on any machine: check the plan and print
#                                                  every command, run nothing
#
# Needs a python3 with a CUDA build of torch (and jax with CUDA for the jax steps); the
# machine needs no network. The package and what the image lacks install with
# `pip --no-index --no-deps --target $GPU_SITE` (default .gpu-site, git-ignored) from
# the checkout and from the wheels in $WHEELHOUSE (default .whl, git-ignored), made on a
# machine with network for that machine's Python (3.12, x86-64):
#
#   grep -v '^#' scripts/gpu_wheels.txt | xargs python3 -m pip download --no-deps \
#       --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl
#
# scripts/gpu_wheels.txt lists them: jsonschema's four (the suite's one missing need) and
# flashinfer-python with what it imports. A backend whose library is absent is reported
# unsupported with the reason, never a failure: vLLM (hundreds of MB, pinned to its own
# torch) runs only where it is installed already. Where what travels with a command is
# limited (this workplace's device machines: 64 MiB a call, the flashinfer wheel alone
# 62 MB), install in one call (`--install-only`, the wheels carried; .gpu-site stays on
# the warm machine) and certify in the next.
#
# ONLY=flashinfer,vllm-flash runs those steps alone. Time: the steps run side by side (one GPU holds them all; flashinfer and the JAX steps
# spread over xdist workers, FlashInfer compiling its kernels at their first use), each
# under STEP_TIMEOUT seconds (default 420; a FlashInfer kernel compiling at its first
# call gets --case-timeout 600): about 5 minutes in all, 7 at most.
set -u
cd "$(dirname "$0")/.."
MODE=certify
case "${1:-}" in
    --check) MODE=check; shift ;;
    --install-only) MODE=install; shift ;;
esac
REPORTS=${1:-reports/gpu}
PY=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-.whl}
GPU_SITE=${GPU_SITE:-$PWD/.gpu-site}
STEP_TIMEOUT=${STEP_TIMEOUT:-420}

# NAME DEVICE [pytest args...]: the plan, one step a line (DEVICE - : the backend's own)
PLAN="torch cuda
torch-math cuda
torch-flash cuda
torch-efficient cuda
torch-cudnn cuda
torch-flex cuda -n 4
jax gpu -n 4
jax-cudnn gpu -n 2
flashinfer - -n 4 --case-timeout 600
vllm-flash - -n 2
torch-context-parallel - -k context_parallel"
if [ -n "${ONLY:-}" ]; then      # ONLY=name,name: those steps alone
    PLAN=$(grep -E "^(${ONLY//,/|}) " <<< "$PLAN")
fi

install() {
    mkdir -p "$GPU_SITE"
    local wheels=("$WHEELHOUSE"/*.whl)
    if [ -e "${wheels[0]}" ]; then
        echo "== installing ${#wheels[@]} wheels from $WHEELHOUSE into $GPU_SITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$GPU_SITE" "${wheels[@]}" || return 1
    fi
    echo "== installing this checkout into $GPU_SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
        --no-cache-dir --upgrade --target "$GPU_SITE" . || return 1
}

step() {   # step NAME DEVICE [pytest args...]
    local name=$1 device=$2 start=$SECONDS rc summary
    shift 2
    local args=(-m pytest spec/cases -p no:cacheprovider -q --backend "$name" --report "$REPORTS")
    [ "$device" != - ] && args+=(--device "$device")
    if [ "$MODE" = check ]; then
        echo "$PY ${args[*]} $*"
        return
    fi
    timeout -k 10 "$STEP_TIMEOUT" "$PY" "${args[@]}" "$@" > "$REPORTS/$name.log" 2>&1
    rc=$?
    summary=$(grep -m1 -E "^  [0-9]+ pass" "$REPORTS/$name.log")
    [ "$rc" -eq 124 ] && summary="timed out after ${STEP_TIMEOUT}s"
    [ -z "$summary" ] && summary=$(grep -m1 -E "Error|error" "$REPORTS/$name.log")
    printf '%-24s exit %-3s %4ss %s\n' "$name" "$rc" "$((SECONDS - start))" "$summary"
}

check_plan() {   # every step names a built-in backend; the wheel list parses
    "$PY" - "$PLAN" <<'EOF' || exit 1
import re, sys
from attention_conformance.backends import BUILTIN
names = [line.split()[0] for line in sys.argv[1].splitlines()]
unknown = [n for n in names if n not in BUILTIN]
wheels = [w for w in open("scripts/gpu_wheels.txt").read().split("\n") if w and w[0] != "#"]
bad = [w for w in wheels if not re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", w)]
if unknown or bad:
    sys.exit(f"gpu_certify: unknown backends {unknown}, unpinned wheels {bad}")
print(f"plan: {len(names)} steps ({', '.join(names)}); wheel list: {len(wheels)} pinned")
EOF
}

if [ "$MODE" = check ]; then
    check_plan
    echo "== would install: $PY -m pip install --no-index --no-deps --target $GPU_SITE" \
         "$WHEELHOUSE/*.whl and ."
    echo "== would run, side by side, each under ${STEP_TIMEOUT}s, reports in $REPORTS:"
    while read -r line; do step $line; done <<< "$PLAN"
    exit 0
fi

install || { echo "gpu_certify: installing failed"; exit 1; }
export PYTHONPATH="$GPU_SITE${PYTHONPATH:+:$PYTHONPATH}"
[ "$MODE" = install ] && { echo "installed into $GPU_SITE"; exit 0; }
mkdir -p "$REPORTS"

echo "== GPU"
timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    > "$REPORTS/gpu.txt" 2>&1 || echo "nvidia-smi failed: no NVIDIA driver here?" > "$REPORTS/gpu.txt"
cat "$REPORTS/gpu.txt"
timeout 120 "$PY" - <<'EOF' 2>&1 | tee -a "$REPORTS/gpu.txt"
import importlib
for module in ("torch", "jax", "flashinfer", "vllm"):
    try:
        m = importlib.import_module(module)
        print(module, getattr(m, "__version__", "?"))
    except Exception as exc:
        print(f"{module}: {type(exc).__name__}: {exc}")
import torch
print("CUDA", torch.version.cuda, "devices", torch.cuda.device_count())
EOF

export ATTENTION_CONFORMANCE_SPEC=$PWD/spec   # pytest spec/cases with the package installed
export OMP_NUM_THREADS=1                      # the spec's inputs are tiny
export XLA_PYTHON_CLIENT_PREALLOCATE=false    # several JAX processes share the GPU
export TF_CPP_MIN_LOG_LEVEL=2
export PYTORCH_NVML_BASED_CUDA_CHECK=1        # the ranks fork from a process that asked

echo "== certifying (each step at most ${STEP_TIMEOUT}s, side by side)"
{ while read -r line; do step $line & done <<< "$PLAN"; wait; } | tee "$REPORTS/summary.txt"

echo "== matrix"
timeout 60 "$PY" -m attention_conformance report "$REPORTS"
if [ -n "${OUT:-}" ] && [ "$(realpath -m "$OUT")" != "$(realpath -m "$REPORTS")" ]; then
    mkdir -p "$OUT"
    cp "$REPORTS/summary.txt" "$REPORTS/gpu.txt" "$OUT/"
    cp "$REPORTS/matrix.md" "$OUT/" 2>/dev/null
    tar czf "$OUT/gpu-reports.tar.gz" -C "$(dirname "$REPORTS")" "$(basename "$REPORTS")"
fi
echo "reports, logs and the GPU's description are in $REPORTS"
