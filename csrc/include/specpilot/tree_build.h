// Launcher of the draft-tree build kernel (csrc/cuda/tree_build.cu): python's engine/tree/build.py
// grow_tree and engine/tree/layout.py pack_tensors in one launch instead of ~300 small torch kernels
// (a sort, gathers and cats per depth). Torch-free; returns a cudaError_t as int (0 = success); the
// binding (csrc/bindings/tree_build_cuda.cpp) checks shapes, dtypes and devices first.
//
// Exactness: the same nodes in the same order as grow_tree. Each candidate score is the same one fp32
// addition (kept score + log-prob), and each stable descending sort becomes a count of the candidates
// that outrank one (a larger score, or an equal one enumerated first), so ties fall as torch's stable
// sort leaves them. Integers otherwise. One difference: a NaN log-prob counts as -inf (grow_tree's
// sort would rank it first), so any input gives a valid tree; the verify keeps the output exact anyway.
#pragma once

#include <cstdint>

namespace specpilot {
namespace tree_build {

constexpr int kMaxBudget = 256;   // nodes, the anchor included
constexpr int kMaxRows = 64;      // drafted depths (a block of up to 65 rows)

// logp [rows, ranks] fp32: each depth's best log-probs, non-increasing along a row (topk's order);
// ids [rows, ranks]: their token ids. drafted: int64 [1] or null; rows from *drafted on are padding
// (scored -inf). anchor, start: int64 [1] (the root's token, its position). n: the node count
// (tree_size(rows, vocab, budget), at least 2), keep = budget - 1, ranks = min(keep, vocab).
// out int64 [4n + n*n + n + n*(rows + 1)]: TreeInputs' packed (tokens, parents, slots, rope positions,
// ancestors), then TreeTensors' depth and path, as grow_tree + pack_tensors give them.
int cuda_grow_tree(const float* logp, const int64_t* ids, int rows, int ranks, const int64_t* drafted,
                   const int64_t* anchor, const int64_t* start, int keep, int n, int64_t* out, void* stream);

}  // namespace tree_build
}  // namespace specpilot
