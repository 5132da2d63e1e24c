#!/usr/bin/env bash
# One hash over every file the extension is built from (csrc/ and setup.py), run from the repository
# root: scripts/prebuild_cuda_ext.sh records it beside the prebuilt extension and bench/gpu_check.sh
# compares it with the tree it runs in, so a stale prebuilt extension is never used.
set -euo pipefail
find csrc setup.py -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
