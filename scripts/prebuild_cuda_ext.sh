#!/usr/bin/env bash
# Builds the CUDA extension (sm_90a) on a CPU machine, so that a device call spends no minutes
# compiling: against the device image's torch (2.11.0+cu130 from PyPI, CPython 3.12) with this
# machine's nvcc 13.0, in a venv of its own. The result, stripped and xz-compressed (55 -> 1.4 MB, so
# a call carries it beside the zoo pair in shared/ within its 64 MiB), and a hash of the sources it
# was built from go to .prebuilt/ (git-ignored); the device call carries it (run's carry:
# [".prebuilt"]) and `bash bench/gpu_check.sh prebuilt ...` stages it, or builds there if the sources
# changed since.
#   PY312=/path/to/python3.12 bash scripts/prebuild_cuda_ext.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-python3.12}
VENV=${PREBUILD_VENV:-/tmp/specpilot-prebuild-venv}
TORCH=${PREBUILD_TORCH:-torch==2.11.0}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "no nvcc under CUDA_HOME=$CUDA_HOME"; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install -q "$TORCH" numpy ninja "setuptools<82"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
# What a device call sends: tracked files and untracked ones git does not ignore.
git ls-files --cached --others --exclude-standard | tar cf - -T - | tar xf - -C "$src"
(cd "$src" && CUDA_HOME=$CUDA_HOME SPECPILOT_CUDA=1 PATH="$CUDA_HOME/bin:$VENV/bin:$PATH" \
   "$VENV/bin/python" setup.py -q build_ext --inplace)
mkdir -p .prebuilt
rm -f .prebuilt/_C.*
for so in "$src"/python/specpilot/_C.*.so; do
  strip --strip-debug -o "$src/stripped.so" "$so"
  xz -9 -T0 -c "$src/stripped.so" > ".prebuilt/$(basename "$so").xz"
done
(cd "$src" && bash bench/ext_sources_hash.sh) > .prebuilt/sources.sha256
ls -la .prebuilt
