"""CUDA source templates for the split12 GEMV (M = 1) under the NVRTC launch contract.

Exactness contract of every template here: weights decode bit-exactly (escapes substituted in
place); y[n] = bf16_rne(fp32 sum of exact bf16*bf16 products) in the template's own order, so the
output is within the fp32-accumulation bound of the fp64 reference (checked by agents/gate.py).

`NAIVE` is deliberately slow (one thread per row, byte loads, uncoalesced): the agents' start.
`render(params)` is the searchable template: rows per block, threads per row, groups of 8 columns
per vector load, loop unroll. Every variant takes N, K, kpad at run time (no shape special-casing).
"""
from dataclasses import asdict, dataclass

# Shared device helpers. bf16 travels as raw uint16 bits so no CUDA header is needed (NVRTC).
PRELUDE = r"""
typedef unsigned char uint8_t;
#define SP_NO_ESC 0x7fffffff

__device__ __forceinline__ float sp_bf16_to_f32(unsigned int bits16) {
    return __uint_as_float(bits16 << 16);
}

__device__ __forceinline__ unsigned short sp_f32_to_bf16_rne(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;   // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
    return (unsigned short)(u >> 16);
}
"""

NAIVE = PRELUDE + r"""
// One thread per row, one weight at a time: correct, slow, the agents' starting point.
extern "C" __global__ void split12_gemv(const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
        const int* esc_rowptr, const int* esc_col, const unsigned short* esc_val,
        const unsigned short* x, unsigned short* y, int N, int K, int kpad) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int p = esc_rowptr[n], p_end = esc_rowptr[n + 1];
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
        int j = k & 7;
        unsigned int cb = codes[(size_t)n * (kpad / 2) + (k >> 3) * 4 + (j & 3)];
        unsigned int code = j < 4 ? (cb & 15u) : (cb >> 4);
        unsigned int hi = ((code >> 3) << 7) | ((code & 7u) + base[n]);
        unsigned int bits = (hi << 8) | lo[(size_t)n * kpad + k];
        if (p < p_end && esc_col[p] == k) { bits = esc_val[p]; ++p; }
        acc += sp_bf16_to_f32(bits) * sp_bf16_to_f32(x[k]);
    }
    y[n] = sp_f32_to_bf16_rne(acc);
}
"""

TILED = PRELUDE + r"""
#define TPR {threads_per_row}
#define RPB {rows_per_block}
#define VEC {vec_groups}

// 8 weights of one group: code word (8 nibbles), low bytes l0 (j=0..3) and l1 (j=4..7).
__device__ __forceinline__ float sp_group_dot(unsigned int cw, unsigned int l0, unsigned int l1,
        const unsigned int* xw, unsigned int base4, float acc, int col0, int nvalid,
        int& p, int p_end, int& next_esc, const int* esc_col, const unsigned short* esc_val) {
    // hi byte = sign << 7 | (cls + base): one add per 4 weights (base <= 120, cls <= 7: no carry)
    unsigned int n_lo = cw & 0x0f0f0f0fu, n_hi = (cw >> 4) & 0x0f0f0f0fu;
    unsigned int h0 = ((n_lo & 0x07070707u) + base4) | ((n_lo & 0x08080808u) << 4);
    unsigned int h1 = ((n_hi & 0x07070707u) + base4) | ((n_hi & 0x08080808u) << 4);
    unsigned int pr[4] = {__byte_perm(l0, h0, 0x5140), __byte_perm(l0, h0, 0x7362),
                          __byte_perm(l1, h1, 0x5140), __byte_perm(l1, h1, 0x7362)};
    float w[8], xf[8];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = __uint_as_float(pr[i] << 16);
        w[2 * i + 1] = __uint_as_float(pr[i] & 0xffff0000u);
        xf[2 * i] = __uint_as_float(xw[i] << 16);
        xf[2 * i + 1] = __uint_as_float(xw[i] & 0xffff0000u);
    }
    if (next_esc < col0 + 8) {  // rare: substitute escaped weights in place (same order)
        while (next_esc < col0) { ++p; next_esc = p < p_end ? esc_col[p] : SP_NO_ESC; }
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (next_esc == col0 + j) {
                w[j] = sp_bf16_to_f32(esc_val[p]);
                ++p; next_esc = p < p_end ? esc_col[p] : SP_NO_ESC;
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < 8; ++j) if (j < nvalid) acc = fmaf(w[j], xf[j], acc);
    return acc;
}

extern "C" __global__ void __launch_bounds__(TPR * RPB) split12_gemv(
        const uint8_t* lo, const uint8_t* codes, const uint8_t* base,
        const int* esc_rowptr, const int* esc_col, const unsigned short* esc_val,
        const unsigned short* x, unsigned short* y, int N, int K, int kpad) {
    const int lane = threadIdx.x % TPR;
    const int n = blockIdx.x * RPB + threadIdx.x / TPR;
    float acc = 0.f;
    if (n < N) {
        const uint8_t* lo_row = lo + (size_t)n * kpad;
        const uint8_t* code_row = codes + (size_t)n * (kpad / 2);
        const unsigned int base4 = (unsigned int)base[n] * 0x01010101u;
        int p = esc_rowptr[n];
        const int p_end = esc_rowptr[n + 1];
        int next_esc = p < p_end ? esc_col[p] : SP_NO_ESC;
        // vector loads of x need 16-byte alignment; a misaligned view takes the scalar tail path
        const int full_chunks = ((size_t)x & 15) == 0 ? K / (8 * VEC) : 0;
        #pragma unroll {unroll}
        for (int c = lane; c < full_chunks; c += TPR) {
            unsigned int cw[VEC], lw[2 * VEC], xw[4 * VEC];
#if VEC == 1
            cw[0] = *(const unsigned int*)(code_row + c * 4);
            uint2 l = *(const uint2*)(lo_row + c * 8); lw[0] = l.x; lw[1] = l.y;
#elif VEC == 2
            uint2 cc = *(const uint2*)(code_row + c * 8); cw[0] = cc.x; cw[1] = cc.y;
            uint4 l = *(const uint4*)(lo_row + c * 16); lw[0] = l.x; lw[1] = l.y; lw[2] = l.z; lw[3] = l.w;
#else
            uint4 cc = *(const uint4*)(code_row + c * 16); cw[0] = cc.x; cw[1] = cc.y; cw[2] = cc.z; cw[3] = cc.w;
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint4 l = *(const uint4*)(lo_row + c * 32 + h * 16);
                lw[4 * h] = l.x; lw[4 * h + 1] = l.y; lw[4 * h + 2] = l.z; lw[4 * h + 3] = l.w;
            }
#endif
            #pragma unroll
            for (int v = 0; v < VEC; ++v) {
                uint4 xv = *(const uint4*)(x + (c * VEC + v) * 8);
                xw[4 * v] = xv.x; xw[4 * v + 1] = xv.y; xw[4 * v + 2] = xv.z; xw[4 * v + 3] = xv.w;
            }
            #pragma unroll
            for (int v = 0; v < VEC; ++v)
                acc = sp_group_dot(cw[v], lw[2 * v], lw[2 * v + 1], xw + 4 * v, base4, acc,
                                   (c * VEC + v) * 8, 8, p, p_end, next_esc, esc_col, esc_val);
        }
        // tail: groups past the last full vector chunk, masked per column
        for (int g = full_chunks * VEC + lane; g * 8 < K; g += TPR) {
            unsigned int cw = *(const unsigned int*)(code_row + g * 4);
            uint2 l = *(const uint2*)(lo_row + g * 8);
            unsigned int xw[4];
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                int k0 = g * 8 + 2 * i;
                unsigned int a = k0 < K ? x[k0] : 0u, b = k0 + 1 < K ? x[k0 + 1] : 0u;
                xw[i] = a | (b << 16);
            }
            acc = sp_group_dot(cw, l.x, l.y, xw, base4, acc, g * 8, K - g * 8, p, p_end, next_esc,
                               esc_col, esc_val);
        }
    }
    // reduce the TPR partial sums of a row (every thread takes part, rows past N add zeros)
    #pragma unroll
    for (int off = (TPR < 32 ? TPR : 32) / 2; off > 0; off >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, off, TPR < 32 ? TPR : 32);
#if TPR > 32
    __shared__ float partial[RPB][TPR / 32];
    if (lane % 32 == 0) partial[threadIdx.x / TPR][lane / 32] = acc;
    __syncthreads();
    if (lane == 0) {
        acc = 0.f;
        #pragma unroll
        for (int i = 0; i < TPR / 32; ++i) acc += partial[threadIdx.x / TPR][i];
    }
#endif
    if (lane == 0 && n < N) y[n] = sp_f32_to_bf16_rne(acc);
}
"""


@dataclass(frozen=True)
class GemvParams:
    """One point of the tiled template's search space (None everywhere = the naive kernel)."""
    threads_per_row: int = 0    # 0: naive (one thread per row)
    rows_per_block: int = 0
    vec_groups: int = 1         # groups of 8 columns per vector load: 1, 2 or 4
    unroll: int = 1

    @property
    def naive(self) -> bool:
        return self.threads_per_row == 0

    def validate(self) -> None:
        if self.naive:
            return
        tpr, rpb = self.threads_per_row, self.rows_per_block
        if tpr not in (4, 8, 16, 32, 64, 128, 256) or rpb < 1 or tpr * rpb % 32 or tpr * rpb > 1024:
            raise ValueError(f"bad split12 GEMV geometry: threads_per_row={tpr}, rows_per_block={rpb} "
                             "(need power-of-two threads per row 4..256, a block of 32..1024 threads)")
        if self.vec_groups not in (1, 2, 4) or self.unroll not in (1, 2, 4, 8):
            raise ValueError(f"bad split12 GEMV params: vec_groups={self.vec_groups} (1, 2, 4), "
                             f"unroll={self.unroll} (1, 2, 4, 8)")

    def launch(self, n_rows: int):
        """(grid, block) for N rows."""
        if self.naive:
            return ((n_rows + 127) // 128,), (128,)
        return ((n_rows + self.rows_per_block - 1) // self.rows_per_block,), (self.threads_per_row * self.rows_per_block,)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_params(cls, params: dict) -> "GemvParams":
        """The geometry named in a candidate's or an integrated record's params (missing keys: defaults)."""
        keys = ("threads_per_row", "rows_per_block", "vec_groups", "unroll")
        return cls(**{k: int(params[k]) for k in keys if k in params})

    def label(self) -> str:
        if self.naive:
            return "naive"
        return f"tpr{self.threads_per_row}-rpb{self.rows_per_block}-vec{self.vec_groups}-u{self.unroll}"


NAIVE_PARAMS = GemvParams()


def render(params: GemvParams) -> str:
    """The CUDA source of one variant (exported as `split12_gemv`)."""
    params.validate()
    if params.naive:
        return NAIVE
    out = TILED
    for key, value in params.to_dict().items():
        out = out.replace("{" + key + "}", str(value))
    return out
