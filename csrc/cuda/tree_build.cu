// The draft tree of engine/tree/build.py (grow_tree) and its packing (engine/tree/layout.py,
// pack_tensors) in one CTA; contract and exactness: specpilot/tree_build.h.
//
// Depth by depth, the candidates are (kept node i of the previous depth, rank r of this depth), scored
// s[i] + lp[r], and the depth keeps the `keep` best in (score descending, enumeration i * ranks + r)
// order. Both s and lp are non-increasing, so every (i', r') with i' <= i and r' <= r outranks (i, r):
// a candidate with (i + 1)(r + 1) > keep can never be kept, and among the rest (E, a few hundred) a
// kept candidate's place is the number of E's candidates that outrank it. Those outside the kept ones
// count at least `keep` (every kept candidate is in E and outranks them). The tree is then the n - 1
// best kept nodes over all depths in (score, depth, place) order: each depth's list is sorted, so a
// node's place there is a binary search per depth. Numbers, parents, root paths and the ancestor
// matrix follow from the kept nodes' parent links.
#include <cuda_runtime.h>

#include <cmath>

#include "specpilot/tree_build.h"

namespace specpilot {
namespace tree_build {
namespace {

constexpr int kThreads = 512;

// E's size: the candidates (i, r) with (i + 1)(r + 1) <= keep and r < ranks.
__host__ __device__ inline int row_length(int i, int keep, int ranks) { return min(ranks, keep / (i + 1)); }

__host__ __device__ inline int candidates(int keep, int ranks) {
  int total = 0;
  for (int i = 0; i < keep; ++i) total += row_length(i, keep, ranks);
  return total;
}

// The shared memory, in this order: score [rows * keep] f32, lp [ranks] f32, cand [E] f32, row_start
// [keep + 1] i32, count [rows] i32, then int16: parent, token_rank, number [rows * keep], e_row,
// e_rank [E]. Kept node j of depth d lives at d * keep + j.
size_t smem_bytes(int rows, int keep, int ranks) {
  const size_t e = candidates(keep, ranks), kept = (size_t)rows * keep;
  return 4 * (kept + ranks + e + keep + 1 + rows) + 2 * (3 * kept + 2 * e);
}

__global__ void __launch_bounds__(kThreads) grow_tree_kernel(const float* __restrict__ logp,
                                                             const int64_t* __restrict__ ids, int rows,
                                                             int ranks, const int64_t* drafted,
                                                             const int64_t* anchor, const int64_t* start,
                                                             int keep, int n, int64_t* __restrict__ out) {
  extern __shared__ float smem[];
  const int e_total = candidates(keep, ranks);
  const int kept = rows * keep;
  float* score = smem;
  float* lp = score + kept;
  float* cand = lp + ranks;
  int* row_start = reinterpret_cast<int*>(cand + e_total);
  int* count = row_start + keep + 1;
  short* parent = reinterpret_cast<short*>(count + rows);
  short* token_rank = parent + kept;
  short* number = token_rank + kept;
  short* e_row = number + kept;
  short* e_rank = e_row + e_total;
  const int tid = threadIdx.x;

  if (tid == 0) {
    int s = 0;
    for (int i = 0; i < keep; ++i) {
      row_start[i] = s;
      s += row_length(i, keep, ranks);
    }
    row_start[keep] = s;
  }
  __syncthreads();
  for (int i = tid; i < keep; i += kThreads)
    for (int e = row_start[i], r = 0; e < row_start[i + 1]; ++e, ++r) {
      e_row[e] = (short)i;
      e_rank[e] = (short)r;
    }

  const int64_t live_rows = drafted ? *drafted : rows;
  int prev = 1;  // the previous depth's kept nodes (the root before depth 0)
  for (int d = 0; d < rows; ++d) {
    for (int r = tid; r < ranks; r += kThreads) {
      const float v = logp[(int64_t)d * ranks + r];
      lp[r] = (d < live_rows && !isnan(v)) ? v : -INFINITY;
    }
    __syncthreads();  // lp written; also e_row / e_rank on the first depth
    const int size = row_start[prev];
    for (int e = tid; e < size; e += kThreads)
      cand[e] = __fadd_rn(d == 0 ? 0.f : score[(d - 1) * keep + e_row[e]], lp[e_rank[e]]);
    __syncthreads();
    const int take = (int)min((int64_t)keep, (int64_t)prev * ranks);
    for (int e = tid; e < size; e += kThreads) {
      const float v = cand[e];
      int place = 0;
      for (int f = 0; f < size; ++f) {  // E is enumerated in (i, r) order: f < e is "enumerated first"
        const float w = cand[f];
        place += (w > v) || (w == v && f < e);
      }
      if (place < take) {
        score[d * keep + place] = v;
        parent[d * keep + place] = e_row[e];
        token_rank[d * keep + place] = e_rank[e];
      }
    }
    if (tid == 0) count[d] = take;
    prev = take;
    __syncthreads();
  }

  // the n - 1 best kept nodes over all depths: node number = place + 1, n for the rest
  for (int g = tid; g < kept; g += kThreads) {
    const int d = g / keep, j = g % keep;
    if (j >= count[d]) continue;
    const float v = score[g];
    int place = j;
    for (int d2 = 0; d2 < rows; ++d2) {
      if (d2 == d) continue;
      const float* list = score + d2 * keep;
      int lo = 0, hi = count[d2];  // the outranking entries form a prefix of the sorted list
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const bool outranks = d2 < d ? list[mid] >= v : list[mid] > v;
        if (outranks) lo = mid + 1; else hi = mid;
      }
      place += lo;
    }
    number[g] = (short)(place < n - 1 ? place + 1 : n);
  }

  const int width = rows + 1;
  int64_t* tokens = out;
  int64_t* parents = out + n;
  int64_t* slots = out + 2 * n;
  int64_t* rope = out + 3 * n;
  int64_t* ancestors = out + 4 * n;
  int64_t* depth = ancestors + n * n;
  int64_t* path = depth + n;
  const int64_t at = *start;
  for (int i = tid; i < n * n; i += kThreads) ancestors[i] = 0;
  for (int i = tid; i < n; i += kThreads) slots[i] = at + i;
  __syncthreads();  // numbers done, ancestors zeroed
  if (tid == 0) {
    tokens[0] = *anchor;
    parents[0] = -1;
    rope[0] = at;
    depth[0] = 0;
    ancestors[0] = 1;
    path[0] = 0;
    for (int c = 1; c < width; ++c) path[c] = n;
  }
  for (int g = tid; g < kept; g += kThreads) {
    const int d = g / keep, j = g % keep;
    if (j >= count[d] || number[g] >= n) continue;
    const int k = number[g];
    tokens[k] = ids[(int64_t)d * ranks + token_rank[g]];
    parents[k] = d == 0 ? 0 : number[(d - 1) * keep + parent[g]];
    rope[k] = at + d + 1;
    depth[k] = d + 1;
    int64_t* row = path + (int64_t)k * width;
    int64_t* anc = ancestors + (int64_t)k * n;
    row[0] = 0;
    anc[0] = 1;
    for (int c = d + 2; c < width; ++c) row[c] = n;
    for (int dd = d, jj = j; dd >= 0; jj = dd > 0 ? parent[dd * keep + jj] : jj, --dd) {
      const int node = number[dd * keep + jj];  // a kept ancestor: every ancestor of a node is a node
      row[dd + 1] = node;
      anc[node] = 1;
    }
  }
}

}  // namespace

int cuda_grow_tree(const float* logp, const int64_t* ids, int rows, int ranks, const int64_t* drafted,
                   const int64_t* anchor, const int64_t* start, int keep, int n, int64_t* out, void* stream) {
  const size_t smem = smem_bytes(rows, keep, ranks);
  // Set on every launch (host only, legal under graph capture): the attribute is per device.
  int err = (int)cudaFuncSetAttribute(grow_tree_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != 0) return err;
  grow_tree_kernel<<<1, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(logp, ids, rows, ranks, drafted,
                                                                             anchor, start, keep, n, out);
  return (int)cudaGetLastError();
}

}  // namespace tree_build
}  // namespace specpilot
