#!/usr/bin/env bash
# Installs specpilot and what it needs on a CPU machine (CI) or any machine with network access.
# The H200 has no network: bench/gpu_check.sh installs there from the image and carried wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "specpilot install: 1/3 requirements" >&2
python -m pip install -q -r requirements.txt
# Stock DFlash (the token-forcing reference). --no-deps: it pins versions we do not want.
echo "specpilot install: 2/3 stock dflash 0.1.0 (the token-forcing reference)" >&2
python -m pip install -q --no-deps dflash==0.1.0
echo "specpilot install: 3/3 specpilot, building the C++ extension specpilot._C (about 90 s on a CPU, more with CUDA)" >&2
python -m pip install -q --no-build-isolation -e .
echo "specpilot install: done; try: python -m specpilot demo" >&2
