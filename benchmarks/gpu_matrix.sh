#!/usr/bin/env bash
# Certify every torch SDPA kernel, flex_attention and both JAX implementations on one
# CUDA GPU, and print the matrix. Prepared on a machine without a GPU: not run there.
#
#   bash benchmarks/gpu_matrix.sh [REPORT_DIR]       (default reports/gpu)
#
# Needs, in the active Python: this package with its test extra
# (pip install -e ".[test]"), a CUDA build of torch 2.13.0 and jax with CUDA
# (pip install "jax[cuda12]"). Backends: torch (torch's own dispatch), torch-math,
# torch-flash, torch-efficient, torch-cudnn, torch-flex on --device cuda; jax
# (implementation "xla") and jax-cudnn on --device gpu. A missing device or framework
# is that step's load error, in its log; the other steps go on.
#
# Time: the steps run side by side (the spec's inputs are tiny; one GPU holds them all),
# each under STEP_TIMEOUT seconds (default 360, `timeout` kills it past that), so the
# whole script ends within about 6.5 minutes. JAX compiles every new shape, so its
# steps spread over xdist workers. Each step writes REPORT_DIR/NAME.json, NAME.md and
# NAME.log; the expected-failures files were written on a CPU, so a GPU kernel that
# does better shows as an unexpected pass (read the logs).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-reports/gpu}
STEP_TIMEOUT=${STEP_TIMEOUT:-360}
mkdir -p "$OUT"

echo "== GPU"
timeout 30 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv \
    | tee "$OUT/gpu.txt" || echo "nvidia-smi failed: no NVIDIA driver here?" | tee "$OUT/gpu.txt"
timeout 120 python - <<'EOF' 2>&1 | tee -a "$OUT/gpu.txt"
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN",
          torch.backends.cudnn.version(), "available:", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as exc:
    print("torch:", type(exc).__name__, exc)
try:
    import jax
    print("jax", jax.__version__, jax.devices())
except Exception as exc:
    print("jax:", type(exc).__name__, exc)
EOF

export OMP_NUM_THREADS=1                      # the spec's inputs are tiny
export XLA_PYTHON_CLIENT_PREALLOCATE=false    # several JAX processes share the GPU
export TF_CPP_MIN_LOG_LEVEL=2

step() {   # step NAME DEVICE [pytest args...]
    local name=$1 device=$2 start=$SECONDS rc
    shift 2
    timeout -k 10 "$STEP_TIMEOUT" python -m pytest spec/cases -p no:cacheprovider -q \
        --backend "$name" --device "$device" --report "$OUT" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local summary
    summary=$(grep -E "^  [0-9]+ pass" "$OUT/$name.log" | head -1)
    [ "$rc" -eq 124 ] && summary="timed out after ${STEP_TIMEOUT}s"
    [ -z "$summary" ] && summary=$(grep -m1 -E "ERROR|Error" "$OUT/$name.log")
    printf '%-16s %-5s exit %-3s %4ss %s\n' "$name" "$device" "$rc" "$((SECONDS - start))" \
        "$summary"
}

echo "== certifying (each step at most ${STEP_TIMEOUT}s, side by side)"
for name in torch torch-math torch-flash torch-efficient torch-cudnn; do
    step "$name" cuda &
done
step torch-flex cuda -n 4 &        # flex's backward traces with dynamo per new shape
step jax gpu -n 6 &                # XLA compiles per shape: spread over CPU cores
step jax-cudnn gpu -n 3 &
wait

echo "== matrix"
timeout 60 attention-conformance report "$OUT"
echo "reports, logs and the GPU's description are in $OUT"
