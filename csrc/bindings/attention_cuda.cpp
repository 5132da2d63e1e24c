// specpilot::decode_attention (CUDA only; schema here, so the op exists only in CUDA builds):
//   decode_attention(q [B,Hq,T,D], k_cache [B,Hkv,S,D], v_cache [B,Hkv,S,D], last [T] int64, span,
//                    scale, out [B,T,Hq*D]!, workspace [splits, B*T*Hq, D+1] fp32!) -> ()
// Key slot j is visible to query row t iff j < span and j <= last[t]; semantics and exactness in
// csrc/include/specpilot/decode_attention.h. Out-parameters and torch's current stream, so CUDA-graph
// capture allocates nothing here; the number of key splits is the workspace's first dimension.
// writes_at_last: the kernels before this call wrote no key slot below min(last) while it could be
// running (a causal step writes exactly the slots `last` names), so those keys load before the PDL wait.
//   decode_attention_rope(qkv [B,1,(Hq+2Hkv)*D], q_weight [D]?, k_weight [D]?, cos [D], sin [D],
//                         positions [1] int64, eps, k_cache!, v_cache!, span, scale, out!, workspace!)
// the one-token step's qk_norm_rope_cache + decode_attention in one kernel, bit for bit the same
// (RopePrologue in csrc/include/specpilot/decode_attention.h).
//   paged_decode_attention(q [R,Hq,T,D], k_pool [1,Hkv,slots,D], v_pool, page_table [R,P] int32, page_size,
//                          last [R,T] int64, scale, out [R,T,Hq*D]!, workspace [splits, R*T*Hq, D+1] fp32!)
// the same attention for R requests over one paged KV pool (PagedKV in decode_attention.h): request
// r's logical key j at slot page_table[r, j / page_size] * page_size + j % page_size, seen by its row t
// iff j <= last[r, t] (< 0: a padding row, zeros); page_size a power of two.
//   decode_attention_pdl(enable) -> previous: launch the attention path (qk_norm_rope_cache, split,
//   combine) with programmatic dependent launch (1, default) or plainly (0); -1 only reads it.
//   Process-global (attention_pdl.h), read at launch (so at graph capture); Python sets it from
//   EngineConfig.attention_pdl (kernels/decode_attention.py sync_pdl).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include "attention_pdl.h"
#include "check.h"

#include <atomic>
#include <cmath>

#include "specpilot/decode_attention.h"

namespace specpilot {
namespace attention {
namespace {

int64_t decode_attention_pdl(int64_t enable) {
  const bool previous = attention_path_pdl().load();
  if (enable >= 0) attention_path_pdl().store(enable != 0);
  return previous ? 1 : 0;
}

// bf16, on `device`, d contiguous, 16-byte aligned rows (the kernel copies 16-byte chunks).
void check_rows(const char* name, const at::Tensor& t, const at::Device& device, const char* op = "decode_attention") {
  SP_CHECK(t.scalar_type() == at::kBFloat16, op, ": ", name, " must be bfloat16, got ", t.scalar_type());
  SP_CHECK(t.dim() == 4, op, ": ", name, " must be 4-D, got shape ", t.sizes());
  SP_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but q is on ", device);
  SP_CHECK(t.stride(3) == 1, op, ": ", name, " must be contiguous in its last dim, got strides ", t.strides());
  for (int i = 0; i < 3; ++i)
    SP_CHECK(t.stride(i) % 8 == 0, op, ": ", name, " strides must be multiples of 8 elements (16-byte rows), got ",
             t.strides());
  SP_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name, " must start 16-byte aligned, got ",
           t.data_ptr());
}

// out [B, T, Hq * D] bf16 and workspace [splits, B * T * Hq, D + 1] fp32, contiguous, on `dev`.
void check_out_workspace(const char* op, int64_t B, int64_t T, int64_t Hq, int64_t D, const at::Tensor& out,
                         const at::Tensor& workspace, const at::Device& dev) {
  SP_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.device() == dev &&
                  out.sizes() == at::IntArrayRef({B, T, Hq * D}),
           op, ": out must be a contiguous bfloat16 [", B, ", ", T, ", ", Hq * D, "] on ", dev, ", got ",
           out.scalar_type(), " ", out.sizes(), " on ", out.device());
  SP_CHECK(workspace.scalar_type() == at::kFloat && workspace.is_contiguous() && workspace.device() == dev &&
                  workspace.dim() == 3 && workspace.size(1) == B * T * Hq && workspace.size(2) == D + 1,
           op, ": workspace must be a contiguous float32 [splits, ", B * T * Hq, ", ", D + 1, "] on ", dev,
           ", got ", workspace.scalar_type(), " ", workspace.sizes(), " on ", workspace.device());
  const int64_t splits = workspace.size(0);
  SP_CHECK(splits >= 1 && splits <= kMaxSplits, op, ": workspace.size(0) (the key splits) must be in 1..",
           kMaxSplits, ", got ", splits);
}

// Every check of the op's arguments, then the kernel arguments they give.
DecodeAttentionArgs checked_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& last, int64_t span, double scale, at::Tensor& out,
                                 at::Tensor& workspace, bool writes_at_last) {
  SP_CHECK(q.is_cuda(), "decode_attention: q must be a CUDA tensor, got ", q.device());
  const at::Device dev = q.device();
  check_rows("q", q, dev);
  check_rows("k_cache", k_cache, dev);
  check_rows("v_cache", v_cache, dev);
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(1), S = k_cache.size(2);
  SP_CHECK(D == 64 || D == 128, "decode_attention: head dim must be 64 or 128, got ", D);
  SP_CHECK(T >= 1 && T <= kMaxTokens, "decode_attention: T must be in 1..", kMaxTokens, ", got ", T,
           " (longer blocks, e.g. the prefill, go to SDPA)");
  SP_CHECK(k_cache.size(0) == B && k_cache.size(3) == D, "decode_attention: k_cache shape ", k_cache.sizes(),
           " does not match q ", q.sizes(), " (want [", B, ", Hkv, S, ", D, "])");
  SP_CHECK(v_cache.sizes() == k_cache.sizes(), "decode_attention: v_cache shape ", v_cache.sizes(),
           " != k_cache shape ", k_cache.sizes());
  SP_CHECK(Hkv >= 1 && Hq % Hkv == 0 && Hq / Hkv <= kMaxGroups, "decode_attention: Hq=", Hq,
           " must be a multiple of Hkv=", Hkv, " with Hq/Hkv <= ", kMaxGroups);
  SP_CHECK(span >= 1 && span <= S, "decode_attention: span must be in 1..S=", S, ", got ", span);
  SP_CHECK(B * Hkv <= 65535, "decode_attention: B*Hkv=", B * Hkv, " exceeds the grid's 65535");
  SP_CHECK(std::isfinite(scale), "decode_attention: scale must be finite, got ", scale);
  SP_CHECK(last.scalar_type() == at::kLong && last.dim() == 1 && last.size(0) == T && last.is_contiguous(),
           "decode_attention: last must be a contiguous int64 [T=", T, "], got ", last.scalar_type(), " ",
           last.sizes());
  SP_CHECK(last.device() == dev, "decode_attention: last is on ", last.device(), " but q is on ", dev);
  check_out_workspace("decode_attention", B, T, Hq, D, out, workspace, dev);
  const int64_t splits = workspace.size(0);

  DecodeAttentionArgs a{};
  a.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  a.k = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  a.v = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  a.last = last.data_ptr<int64_t>();
  a.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  a.workspace = workspace.data_ptr<float>();
  a.batch = (int)B;
  a.q_heads = (int)Hq;
  a.kv_heads = (int)Hkv;
  a.tokens = (int)T;
  a.head_dim = (int)D;
  a.span = (int)span;
  a.num_splits = (int)splits;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = q.stride(i);
    a.k_stride[i] = k_cache.stride(i);
    a.v_stride[i] = v_cache.stride(i);
  }
  a.scale = (float)scale;
  a.pdl = attention_path_pdl().load();
  a.writes_at_last = writes_at_last;
  return a;
}

void launch(const DecodeAttentionArgs& a, const at::Device& dev) {
  if (a.batch == 0 || a.q_heads == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  const int err = cuda_decode_attention(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  SP_CHECK(err == 0, "decode_attention: CUDA launch failed for B=", a.batch, " Hq=", a.q_heads, " Hkv=", a.kv_heads,
           " T=", a.tokens, " D=", a.head_dim, " span=", a.span, " splits=", a.num_splits, ": ",
           cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void decode_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& last, int64_t span, double scale, at::Tensor& out,
                           at::Tensor& workspace, bool writes_at_last) {
  launch(checked_args(q, k_cache, v_cache, last, span, scale, out, workspace, writes_at_last), q.device());
}

// Attention over a paged KV pool for R requests at once (PagedKV in decode_attention.h): the static
// op's arguments for a batch of R over the pool, then the page table and the per-request `last`.
void paged_decode_attention_cuda(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                 const at::Tensor& page_table, int64_t page_size, const at::Tensor& last, double scale,
                                 at::Tensor& out, at::Tensor& workspace, bool writes_at_last) {
  constexpr const char* op = "paged_decode_attention";
  SP_CHECK(q.is_cuda(), op, ": q must be a CUDA tensor, got ", q.device());
  const at::Device dev = q.device();
  check_rows("q", q, dev, op);
  check_rows("k_pool", k_pool, dev, op);
  check_rows("v_pool", v_pool, dev, op);
  const int64_t R = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k_pool.size(1), slots = k_pool.size(2);
  SP_CHECK(D == 64 || D == 128, op, ": head dim must be 64 or 128, got ", D);
  SP_CHECK(T >= 1 && T <= kMaxTokens, op, ": T must be in 1..", kMaxTokens, ", got ", T);
  SP_CHECK(k_pool.size(0) == 1 && k_pool.size(3) == D, op, ": k_pool must be [1, Hkv, slots, ", D, "], got ",
           k_pool.sizes());
  SP_CHECK(v_pool.sizes() == k_pool.sizes(), op, ": v_pool shape ", v_pool.sizes(), " != k_pool shape ",
           k_pool.sizes());
  SP_CHECK(Hkv >= 1 && Hq % Hkv == 0 && Hq / Hkv <= kMaxGroups, op, ": Hq=", Hq, " must be a multiple of Hkv=", Hkv,
           " with Hq/Hkv <= ", kMaxGroups);
  SP_CHECK(page_size >= 1 && page_size <= (1 << 20) && (page_size & (page_size - 1)) == 0, op,
           ": page_size must be a power of two in 1..2^20, got ", page_size);
  SP_CHECK(slots >= page_size && slots % page_size == 0 && slots <= INT32_MAX, op, ": the pool's ", slots,
           " slots must be a positive multiple of page_size=", page_size, " and at most 2^31 - 1");
  SP_CHECK(R * Hkv <= 65535, op, ": R*Hkv=", R * Hkv, " exceeds the grid's 65535");
  SP_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  SP_CHECK(page_table.scalar_type() == at::kInt && page_table.dim() == 2 && page_table.size(0) == R &&
                  page_table.size(1) >= 1 && page_table.stride(1) == 1 && page_table.device() == dev,
           op, ": page_table must be an int32 [R=", R, ", pages] on ", dev, " with contiguous rows, got ",
           page_table.scalar_type(), " ", page_table.sizes(), " strides ", page_table.strides(), " on ",
           page_table.device());
  const int64_t span = page_table.size(1) * page_size;  // logical keys a request can address
  SP_CHECK(span <= (int64_t(1) << 30), op, ": pages * page_size = ", span, " exceeds 2^30 keys");
  SP_CHECK(last.scalar_type() == at::kLong && last.dim() == 2 && last.size(0) == R && last.size(1) == T &&
                  last.is_contiguous() && last.device() == dev,
           op, ": last must be a contiguous int64 [R=", R, ", T=", T, "] on ", dev, ", got ", last.scalar_type(),
           " ", last.sizes(), " on ", last.device());
  check_out_workspace(op, R, T, Hq, D, out, workspace, dev);

  DecodeAttentionArgs a{};
  a.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  a.k = reinterpret_cast<const uint16_t*>(k_pool.data_ptr());
  a.v = reinterpret_cast<const uint16_t*>(v_pool.data_ptr());
  a.last = last.data_ptr<int64_t>();
  a.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  a.workspace = workspace.data_ptr<float>();
  a.batch = (int)R;
  a.q_heads = (int)Hq;
  a.kv_heads = (int)Hkv;
  a.tokens = (int)T;
  a.head_dim = (int)D;
  a.span = (int)span;
  a.num_splits = (int)workspace.size(0);
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = q.stride(i);
    a.k_stride[i] = k_pool.stride(i);
    a.v_stride[i] = v_pool.stride(i);
  }
  a.scale = (float)scale;
  a.pdl = attention_path_pdl().load();
  a.writes_at_last = writes_at_last;
  a.paged.page_table = page_table.data_ptr<int32_t>();
  a.paged.table_stride = page_table.stride(0);
  int shift = 0;
  while ((int64_t(1) << shift) < page_size) ++shift;
  a.paged.page_shift = shift;
  a.paged.pool_slots = slots;
  launch(a, dev);
}

// A [D] bf16 vector on `dev` (the per-head norm weights, a RoPE table row).
void check_row(const char* name, const at::Tensor& t, int64_t D, const at::Device& dev) {
  SP_CHECK(t.scalar_type() == at::kBFloat16 && t.is_contiguous() && t.numel() == D && t.device() == dev,
           "decode_attention_rope: ", name, " must be a contiguous bfloat16 tensor of ", D, " elements on ", dev,
           ", got ", t.scalar_type(), " ", t.sizes(), " on ", t.device());
}

// The one-token step's qk_norm_rope_cache + decode_attention as one kernel (RopePrologue): q is the
// [B, 1, Hq * D] slice of qkv; k / v of qkv are normed, rotated and written into the caches at
// positions[0]; positions is also the attention's `last` (a causal step).
void decode_attention_rope_cuda(const at::Tensor& qkv, const c10::optional<at::Tensor>& q_weight,
                                const c10::optional<at::Tensor>& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& positions, double eps, at::Tensor& k_cache, at::Tensor& v_cache,
                                int64_t span, double scale, at::Tensor& out, at::Tensor& workspace) {
  SP_CHECK(qkv.is_cuda() && qkv.scalar_type() == at::kBFloat16 && qkv.dim() == 3 && qkv.size(1) == 1 &&
                  qkv.stride(2) == 1,
           "decode_attention_rope: qkv must be a CUDA bfloat16 [B, 1, (Hq + 2 Hkv) * D] with contiguous rows, got ",
           qkv.scalar_type(), " ", qkv.sizes(), " strides ", qkv.strides(), " on ", qkv.device());
  SP_CHECK(k_cache.dim() == 4, "decode_attention_rope: k_cache must be [B, Hkv, S, D], got ", k_cache.sizes());
  const int64_t B = qkv.size(0), Hkv = k_cache.size(1), D = k_cache.size(3);
  SP_CHECK(out.dim() == 3 && D > 0 && out.size(2) % D == 0, "decode_attention_rope: out must be [B, 1, Hq * ", D,
           "], got ", out.sizes());
  const int64_t Hq = out.size(2) / D;
  SP_CHECK(qkv.size(2) == (Hq + 2 * Hkv) * D, "decode_attention_rope: qkv has ", qkv.size(2),
           " columns, want (Hq + 2 Hkv) * D = ", (Hq + 2 * Hkv) * D, " for Hq=", Hq, " Hkv=", Hkv, " D=", D);
  // q as the attention reads it: [B, Hq, 1, D], a view of qkv's first Hq heads.
  const at::Tensor q = qkv.view({B, 1, Hq + 2 * Hkv, D}).narrow(2, 0, Hq).transpose(1, 2);
  DecodeAttentionArgs a = checked_args(q, k_cache, v_cache, positions, span, scale, out, workspace, true);
  const at::Device dev = qkv.device();
  if (q_weight.has_value() && q_weight->defined()) check_row("q_weight", *q_weight, D, dev);
  if (k_weight.has_value() && k_weight->defined()) check_row("k_weight", *k_weight, D, dev);
  SP_CHECK(q_weight.has_value() == k_weight.has_value(), "decode_attention_rope: q_weight and k_weight go together");
  check_row("cos", cos, D, dev);
  check_row("sin", sin, D, dev);
  SP_CHECK(std::isfinite(eps), "decode_attention_rope: eps must be finite, got ", eps);
  a.rope.qkv = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
  a.rope.qkv_batch_stride = qkv.stride(0);
  a.rope.q_weight = q_weight.has_value() ? reinterpret_cast<const uint16_t*>(q_weight->data_ptr()) : nullptr;
  a.rope.k_weight = k_weight.has_value() ? reinterpret_cast<const uint16_t*>(k_weight->data_ptr()) : nullptr;
  a.rope.cos = reinterpret_cast<const uint16_t*>(cos.data_ptr());
  a.rope.sin = reinterpret_cast<const uint16_t*>(sin.data_ptr());
  a.rope.eps = (float)eps;
  a.rope.k_cache = reinterpret_cast<uint16_t*>(k_cache.data_ptr());
  a.rope.v_cache = reinterpret_cast<uint16_t*>(v_cache.data_ptr());
  a.rope.slots = k_cache.size(2);
  launch(a, dev);
}

}  // namespace
}  // namespace attention
}  // namespace specpilot

TORCH_LIBRARY_FRAGMENT(specpilot, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor last, int span, float scale, "
        "Tensor(a!) out, Tensor(b!) workspace, bool writes_at_last=False) -> ()");
  m.def("decode_attention_rope(Tensor qkv, Tensor? q_weight, Tensor? k_weight, Tensor cos, Tensor sin, "
        "Tensor positions, float eps, Tensor(a!) k_cache, Tensor(b!) v_cache, int span, float scale, "
        "Tensor(c!) out, Tensor(d!) workspace) -> ()");
  m.def("decode_attention_pdl(int enable) -> int", &specpilot::attention::decode_attention_pdl);
  m.def("paged_decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor page_table, int page_size, "
        "Tensor last, float scale, Tensor(a!) out, Tensor(b!) workspace, bool writes_at_last=False) -> ()");
}

TORCH_LIBRARY_IMPL(specpilot, CUDA, m) {
  m.impl("decode_attention", &specpilot::attention::decode_attention_cuda);
  m.impl("decode_attention_rope", &specpilot::attention::decode_attention_rope_cuda);
  m.impl("paged_decode_attention", &specpilot::attention::paged_decode_attention_cuda);
}
