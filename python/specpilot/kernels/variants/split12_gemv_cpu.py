"""CPU-runnable twins of the split12 GEMV templates (same launch contract, torch on CPU).

They let the agent loop, the gates and the exploit suite run on a CPU machine with the very same
gate code. Exactness contract: bit-exact decode (via the contract's unpack), fp32 accumulation of
exact bf16*bf16 products in an order set by the params, bf16 round-to-nearest-even output.
"""
import torch

from specpilot.formats.split12.reference import Split12Tensor
from specpilot.kernels.variants.split12_args import round_up
from specpilot.kernels.variants.split12_gemv_cuda import GemvParams
from specpilot.kernels.variants.split12_args import unpack


def decode(lo, codes, base, esc_rowptr, esc_col, esc_val, N, K) -> torch.Tensor:
    """The contract's tensors -> W as fp32 [N, K] (exact)."""
    args = Split12Tensor(lo, codes, base, esc_rowptr, esc_col, esc_val, N=N, K=K)
    return unpack(args).float()


def make_cpu_gemv(params: GemvParams):
    """A callable fn(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad) writing y."""
    params.validate()
    lanes = 1 if params.naive else params.threads_per_row
    width = 8 * (1 if params.naive else params.vec_groups)

    def split12_gemv(lo, codes, base, esc_rowptr, esc_col, esc_val, x, y, N, K, kpad):
        w = decode(lo, codes, base, esc_rowptr, esc_col, esc_val, N, K)     # [N, K]
        prod = w * x[:K].float()                                              # exact in fp32
        # lane l owns chunks l, l + lanes, ...: sum each lane's chunks, then the lanes
        span = round_up(K, width * lanes)
        padded = torch.zeros(N, span, dtype=torch.float32)
        padded[:, :K] = prod
        per_lane = padded.view(N, span // (width * lanes), lanes, width).sum(dim=(1, 3))  # [N, lanes]
        y.copy_(per_lane.sum(dim=1).to(torch.bfloat16))

    split12_gemv.params = params
    return split12_gemv
