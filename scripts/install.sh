#!/usr/bin/env bash
# Installs specpilot and what it needs on a CPU machine (CI) or any machine with network access.
# The H200 has no network: bench/gpu_check.sh installs there from the image and carried wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -r requirements.txt
# Stock DFlash (the token-forcing reference). --no-deps: it pins versions we do not want.
python -m pip install -q --no-deps dflash==0.1.0
python -m pip install -q --no-build-isolation -e .
