// Decode / verify attention over a static KV cache (csrc/cuda/decode_attention.cu), torch-free.
//
// Semantics: q [B, Hq, T, D] bf16, K/V cache [B, Hkv, S, D] bf16 (slot = absolute position),
// last [T] int64. Query row t of head h sees key slot j iff j < span and j <= last[t]; head h
// reads KV head h / (Hq / Hkv). out [B, T, Hq * D] bf16 = softmax(q k^T * scale) v per row, fp32
// scores and accumulation, P rounded to bf16 for the P.V tensor-core product (as flash attention).
// A row that sees no key gets zeros.
//
// Split-KV (flash-decoding): the visible keys [0, kv_end), kv_end = clamp(max(last) + 1, 0, span),
// are cut into num_splits ranges of keys_per_split (split_geometry below, computed on the device
// from `last`, so keys beyond max(last) cost nothing even though a CUDA graph fixes the grid; paged:
// each batch row's own kv_end from its own `last` row, so short requests cost no long one's keys).
// Each CTA handles the up to 64 query rows of one (batch, KV head, row block) that share K/V (GQA
// folded: rows r = j * T + t of query head kv * g + j), over one key range, and writes a partial
// (o normalised, lse) to the fp32 workspace; a combine kernel merges the splits. With
// num_splits == 1 the CTA writes the output directly (no workspace traffic, one launch).
#pragma once

#if defined(__CUDACC__)
#define SPECPILOT_ATTN_HD __host__ __device__ __forceinline__
#else
#define SPECPILOT_ATTN_HD inline
#endif

#include <cstdint>

namespace specpilot {
namespace attention {

constexpr int kMaxTokens = 32;    // T: the AR step (1), verify / draft blocks (16), a little headroom
constexpr int kMaxGroups = 8;     // g = Hq / Hkv
constexpr int kMaxSplits = 128;
constexpr int kSplitKeyAlign = 16;  // key ranges start on a 16-key slice (the mma's k)

// The rope prologue of a one-token step (T = 1): q comes straight from the QKV projection's output,
// normed and rotated in the split kernel with qk_norm_rope_cache's arithmetic (csrc/cuda/rope_row.cuh,
// bit for bit), and this step's k (normed, rotated) and v are written into the cache at slot last[0]
// by the one CTA per (batch, KV head) whose keys end there, before it loads them: one kernel fewer
// per layer than qk_norm_rope_cache + attention.
struct RopePrologue {
  const uint16_t* qkv = nullptr;  // [B, 1, (Hq + 2 Hkv) * D]: q heads, then k heads, then v heads; nullptr: off
  int64_t qkv_batch_stride = 0;   // elements
  const uint16_t* q_weight = nullptr;  // [D] per-head RMSNorm weights, or nullptr (no q/k norm: LLaMA)
  const uint16_t* k_weight = nullptr;
  const uint16_t* cos = nullptr;  // [D]: the token's row of the RoPE tables
  const uint16_t* sin = nullptr;
  float eps = 0.f;
  uint16_t* k_cache = nullptr;    // the cache `k` / `v` below view, writable; slot last[0] is written when
  uint16_t* v_cache = nullptr;    // 0 <= last[0] < slots (as qk_norm_rope_cache: never out of bounds)
  int64_t slots = 0;
};

// Paged KV (the batched engine): k / v are one pool [1, Hkv, pool_slots, D] shared by every batch
// row (k_stride[0] / v_stride[0] unused); logical key j of batch row b lives at physical slot
// page_table[b * table_stride + (j >> page_shift)] << page_shift | (j & page_size - 1), and span =
// pages per row << page_shift. `last` is per batch row: [B, T] (row b at last + b * tokens). Page
// sizes are powers of two (the engine's 16 divides the 64-key tile; 128 or more spans tiles: each key
// row finds its own page). A page entry of a visible key outside [0, pool_slots >> page_shift) reads
// as zeros (never out of bounds); the caller validates the table (kernels/paged_attention.py).
// The table, like `last`, is written by a torch op ahead of the layers: read before the PDL wait.
// No rope prologue in this mode.
struct PagedKV {
  const int32_t* page_table = nullptr;  // [B, table_stride] page indices
  int64_t table_stride = 0;             // elements between batch rows of the table
  int page_shift = 0;                   // log2(page_size)
  int64_t pool_slots = 0;               // slots of the pool (k / v dim 2)
};

struct DecodeAttentionArgs {
  const uint16_t* q;        // bf16 bits; element (b, h, t, d) at b*q_stride[0] + h*q_stride[1] + t*q_stride[2] + d
  const uint16_t* k;        // (b, kv, slot, d) at b*k_stride[0] + kv*k_stride[1] + slot*k_stride[2] + d
  const uint16_t* v;
  const int64_t* last;      // [T] (paged: [B, T])
  uint16_t* out;            // [B, T, Hq * D], contiguous
  float* workspace;         // num_splits * B*T*Hq * (D + 1) floats: o [num_splits, B*T*Hq, D] (normalised),
                            // then lse [num_splits, B*T*Hq] (log2 domain)
  int batch, q_heads, kv_heads, tokens, head_dim, span, num_splits;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // in elements; strides multiple of 8, d stride 1
  float scale;
  bool pdl;                 // launch the combine kernel with programmatic dependent launch (sm_90)
  bool writes_at_last;      // the kernels before wrote no key slot below min(last) since this call's
                            // predecessor started (a causal step writes exactly the slots `last` names):
                            // keys below min(last) are loaded before the PDL wait
  RopePrologue rope;        // T = 1 only; with rope.qkv set, `q` is not read
  PagedKV paged;            // page_table nullptr: the per-batch cache above (today's layout)
};

struct SplitGeometry {
  int kv_end;          // keys [0, kv_end) are visible to some row
  int keys_per_split;  // a multiple of kSplitKeyAlign
  int active_splits;   // splits with at least one key: ceil(kv_end / keys_per_split) <= num_splits
};

// The one definition of how keys are cut, shared by the split and the combine kernel.
SPECPILOT_ATTN_HD SplitGeometry split_geometry(int kv_end, int num_splits) {
  SplitGeometry g;
  g.kv_end = kv_end;
  const int per = (kv_end + num_splits - 1) / num_splits;
  g.keys_per_split = per < 1 ? kSplitKeyAlign : (per + kSplitKeyAlign - 1) / kSplitKeyAlign * kSplitKeyAlign;
  g.active_splits = (kv_end + g.keys_per_split - 1) / g.keys_per_split;
  return g;
}

// Launches the split kernel (and the combine kernel when num_splits > 1) on `stream` (a
// cudaStream_t). head_dim 64 or 128. Returns a cudaError_t as int (0 = success).
int cuda_decode_attention(const DecodeAttentionArgs& args, void* stream);

}  // namespace attention
}  // namespace specpilot
