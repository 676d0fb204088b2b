#!/usr/bin/env bash
# One-shot verification of the GPU paths on a machine with an NVIDIA GPU (run from anywhere in
# a checkout of this repository):
#   1. nvidia-smi answers (else: stop, exit 2);
#   2. a Python environment with CUDA torch and TensorRT: $VENV if given (used as it is), else
#      .venv-gpu created from requirements.txt + tensorrt-cu12 (needs PyPI, or a pip
#      configuration that points at a mirror);
#   3. TensorRT engines for the tiny and small presets (random weights) with
#      `vla-runtime build-engine --backend tensorrt --precision fp16`;
#   4. the GPU tests: TensorRT vs torch parity and plan caching, the TensorRT built engine, the
#      CUDA-graph replay vs eager (they skip without a GPU; here a skip is a failure);
#   5. latency against the weight-bandwidth floor: `vla-runtime bench engine --device cuda
#      --preset small` (torch eager and CUDA graph) and the small TensorRT engine.
# Output: the figures on stdout, everything under $OUT (default runs/verify_gpu).
#
#   engines/verify_gpu.sh
#   VENV=/path/to/venv engines/verify_gpu.sh     # an environment that already has it all
set -euo pipefail
cd "$(dirname "$0")/.."

TENSORRT_PIN=tensorrt-cu12==10.16.1.11  # TensorRT 10 for CUDA 12 (tensorrt_backend: >= 10 API)
OUT=${OUT:-runs/verify_gpu}
DEVICE=${DEVICE:-cuda:0}
PYTHON=${PYTHON:-python3}

fail() {
  echo "verify_gpu.sh: $*" >&2
  exit 2
}

# 1. the GPU
command -v nvidia-smi >/dev/null \
  || fail "no NVIDIA GPU here (nvidia-smi not found): run this on a machine with an NVIDIA GPU and its driver"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  || fail "nvidia-smi is installed but does not answer (driver not loaded?)"

# 2. the environment
if [ -n "${VENV:-}" ]; then
  [ -x "$VENV/bin/python" ] || fail "VENV=$VENV has no bin/python"
else
  VENV=.venv-gpu
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || fail "could not create $VENV with $PYTHON (python3-venv missing?)"
  fi
  stamp=$VENV/.requirements.sha
  want=$( (cat requirements.txt; echo "$TENSORRT_PIN") | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing requirements.txt + $TENSORRT_PIN into $VENV (torch with CUDA: several GB)"
    "$VENV/bin/python" -m pip install -q -r requirements.txt "$TENSORRT_PIN" \
      pytest==9.0.3 pytest-timeout==2.4.0 \
      || fail "pip could not install the requirements (no PyPI? give VENV=... an environment that has them)"
    "$VENV/bin/python" -m pip install -q --no-deps -e . || fail "pip install -e . failed"
    echo "$want" > "$stamp"
  fi
fi
PY=$VENV/bin/python
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1
"$PY" - "$DEVICE" <<'EOF' || fail "the environment in $VENV cannot run the GPU paths (above)"
import sys

import torch

device = sys.argv[1]
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (a CPU-only wheel?)")
try:
    import tensorrt
except ImportError as exc:
    sys.exit(f"tensorrt is not importable: {exc}")
import vla_runtime  # noqa: F401  the package itself (pip install -e .)

print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
      f"{torch.cuda.get_device_name(device)}, TensorRT {tensorrt.__version__}")
EOF
mkdir -p "$OUT"

# 3. TensorRT engines
for preset in tiny small; do
  echo "building the TensorRT fp16 engine of the $preset preset"
  "$VENV/bin/vla-runtime" build-engine --preset "$preset" --backend tensorrt --precision fp16 \
    --device "$DEVICE" --out "$OUT/engines" --json | tee "$OUT/engine_$preset.json" \
    || fail "build-engine failed for the $preset preset (above)"
done

# 4. the GPU tests; a skip would mean the path was not verified
"$PY" -m pytest -q -p no:cacheprovider -rs test/unit/test_tensorrt_backend.py \
  test/unit/test_built_engine.py test/unit/test_cuda_graph.py | tee "$OUT/tests.txt" \
  || fail "GPU tests failed (above)"
if grep -q "^SKIPPED" "$OUT/tests.txt"; then
  fail "some GPU tests were skipped (see above): the GPU paths are not verified"
fi

# 5. latency against the weight-bandwidth floor
"$VENV/bin/vla-runtime" bench engine --device "$DEVICE" --preset small --json --no-progress \
  > "$OUT/bench_engine_small.json" || fail "bench engine failed (above)"
"$PY" - "$OUT" "$DEVICE" <<'EOF' || fail "latency check failed (above)"
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from vla_runtime.engine.factory import load_policy
from vla_runtime.engine.policy import Observation

out, device = Path(sys.argv[1]), sys.argv[2]
cuda = json.loads((out / "bench_engine_small.json").read_text()).get("cuda")
if not cuda:
    sys.exit("bench engine reported no CUDA figures")
floor, floor_steps = cuda["weight_floor_ms"], cuda["weight_floor_with_steps_ms"]
engine = Path(json.loads((out / "engine_small.json").read_text())["directory"])
policy = load_policy("tensorrt", str(engine), device=device, seed=0)
spec = policy.spec
rng = np.random.default_rng(0)
obs = Observation(
    {c.name: rng.integers(0, 256, (c.height, c.width, 3), dtype=np.uint8) for c in spec.cameras},
    rng.normal(size=spec.state_dim).astype(np.float32), "pick up the red cube", 0.0,
)
times = []
for i in range(60):
    start = time.perf_counter()
    policy.infer(obs)
    policy.synchronize()
    if i >= 10:
        times.append((time.perf_counter() - start) * 1e3)
trt_p50 = statistics.median(times)
rows = [
    ("torch eager p50", cuda["eager_p50_ms"]),
    ("torch CUDA graph p50", cuda["cuda_graph_p50_ms"]),
    ("TensorRT fp16 engine p50 (full inference, v0d0)", trt_p50),
]
print(f"\nsmall preset on {cuda['gpu']}: weight floor {floor:.3f} ms "
      f"({floor_steps:.3f} ms with the expert read every step) at "
      f"{cuda['memory_bandwidth_Bps'] / 1e12:.1f} TB/s "
      "(the bench's figure for an H200; scale it for another GPU)")
for name, ms in rows:
    print(f"  {name:<48} {ms:8.3f} ms  = {ms / floor_steps:6.1f} x the floor with steps")
error = cuda["cuda_graph_max_abs_err"]
print(f"  CUDA graph vs eager max abs err {error:.2e}")
if error > 1e-3:
    sys.exit("CUDA graph replay differs from eager")
EOF
echo "verify_gpu.sh: GPU paths verified; figures under $OUT"
