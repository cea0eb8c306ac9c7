#!/usr/bin/env bash
# One GPU session's checks, in one call on a lent CUDA machine (run from the repository root):
#
#     [NOTEBOOKS=04,12] [SWEEP=64:1] tools/gpu_session.sh OUT_DIR
#
# NOTEBOOKS: only these lessons/solutions (default: all); SWEEP: head dim and causal of the sweep (default 128:0).
#
# 1. lesson 08's Triton kernels against SDPA's FLASH backend (correctness, TFLOP/s), lesson 09's sliding
#    window and lesson 13's NCCL ring (tools/gpu_bench.py, at most ~4 min);
# 2. every lesson and solution notebook run top to bottom on the GPU, as a learner on Colab would, 8 at a
#    time (tools/gpu_notebooks.py, at most ~4 min);
# 3. the Triton kernels' block/warp/stage sweep with what time is left (at most 1 min).
# Wheels for what the machine lacks (Jupyter's kernel and client, ipywidgets) travel in .whl/ (see
# tools/README.md). Everything lands in OUT_DIR: log, bench.tar.gz, notebooks.json, executed.tar.gz.
set -u
OUT=${1:?usage: tools/gpu_session.sh OUT_DIR}
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "wheel install failed"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
B="$OUT/bench.d"
date -u +%T; timeout 230 python3 tools/gpu_bench.py --out "$B" --deadline-s 180 \
  --sections env,flash_check,flash_perf,sparse,ring
date -u +%T; OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 timeout 230 python3 tools/gpu_notebooks.py --out "$OUT" \
  --jobs 8 --timeout 200 --dirs notebooks,solutions --only "${NOTEBOOKS:-}"
pkill -f ipykernel_launcher; date -u +%T; timeout 70 python3 tools/gpu_bench.py --out "$B" --deadline-s 45 --sections flash_sweep --sweep "${SWEEP:-}"
date -u +%T; tar -czf "$OUT/bench.tar.gz" -C "$B" . && rm -rf "$B"
ls -la "$OUT"
