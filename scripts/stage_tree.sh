#!/usr/bin/env bash
# Stages another revision of the package for `bench/gpu_check.sh trees` (scripts/ab_trees.py): its three
# package folders and its CUDA extension, prebuilt here on the CPU for the device, into tree/ (git-ignored;
# name it in the device call's carry, ~4 MB).
#   bash scripts/stage_tree.sh pre-restructure
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/stage_tree.sh REVISION}
git rev-parse --verify -q "$rev^{commit}" > /dev/null || { echo "stage_tree: no revision $rev"; exit 2; }
grep -qx '/tree/' .git/info/exclude 2>/dev/null || echo '/tree/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git worktree add -q --detach "$work/src" "$rev"
(cd "$work/src" && bash scripts/prebuild_cuda_ext.sh > "$work/prebuild.log" 2>&1) \
  || { tail -20 "$work/prebuild.log"; git worktree remove --force "$work/src"; exit 1; }
rm -rf tree && mkdir tree
git archive "$rev" python agents bench | tar x -C tree
cp "$work"/src/.prebuilt/_C.*.so.xz tree/
echo "$rev $(git rev-parse "$rev")" > tree/REVISION
git worktree remove --force "$work/src"
du -sh tree
