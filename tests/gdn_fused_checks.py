"""Shared by the GDN fused ops' GPU test and host emulation: the torch path they are held to, random
inputs in the model's layout, and the bf16 ulp rule (tests/test_gdn_fused_gpu.py's docstring says
why these bounds)."""
import torch

from specpilot.models import gdn

MAX_DIFFERING = 0.01       # share of elements allowed to differ at all (rare rounding-boundary flips)
MIXED_ULPS, BETA_ULPS, NORM_ULPS = 2, 1, 3     # one ulp per bf16 rounding after a reordered fp32 sum


def ordered(x: torch.Tensor) -> torch.Tensor:
    """bf16 values -> integers in value order, consecutive bf16 values one apart (+0 and -0 both 0)."""
    bits = x.to(torch.bfloat16).contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def assert_bf16_close(actual, expected, max_ulps: int, what: str):
    assert actual.shape == expected.shape, f"{what}: shape {list(actual.shape)} != {list(expected.shape)}"
    assert not actual.float().isnan().any(), f"{what}: NaN (an element was not written)"
    assert torch.equal(actual.float().to(torch.bfloat16).float(), actual.float()), f"{what}: not bf16 values"
    ulps = (ordered(actual) - ordered(expected)).abs()
    assert int(ulps.max()) <= max_ulps, f"{what}: {int(ulps.max())} bf16 ulps apart (at most {max_ulps})"
    share = float((ulps > 0).float().mean())
    assert share <= MAX_DIFFERING, f"{what}: {share:.2%} of the elements differ (at most {MAX_DIFFERING:.0%})"


def gdn_block(t, c, hv, width, param_dtype, gen, device):
    """(qkv, b, a [1, T, .] as column slices of one projection (as in_proj's split), conv state, conv
    weight, A_log, dt_bias) with random_hybrid's laws; a spans both sides of softplus's threshold."""
    proj = torch.randn(1, t, c + 64 + 2 * hv, generator=gen, device=device)
    proj[..., -hv:] *= 12
    proj[..., -1] = 25.0                                          # past the threshold (20) for any dt_bias here
    qkv, _, b, a = proj.to(torch.bfloat16).split((c, 64, hv, hv), dim=-1)
    conv_state = torch.randn(1, c, width - 1, generator=gen, device=device).to(torch.bfloat16)
    conv_weight = (torch.randn(c, width, generator=gen, device=device) / width ** 0.5).to(torch.bfloat16)
    A_log = (torch.rand(hv, generator=gen, device=device) * 7 + 1).log().to(param_dtype)
    dt_bias = torch.randn(hv, generator=gen, device=device).to(param_dtype)
    return qkv, b, a, conv_state, conv_weight, A_log, dt_bias


def torch_prologue(qkv, b, a, conv_state, conv_weight, A_log, dt_bias):
    """models/hybrid.py GatedDeltaNet.forward's torch path up to the recurrence -> (mixed [T, C],
    window [1, C, K-1+T], g [T, hv] fp32, beta [T, hv] fp32)."""
    window = torch.cat([conv_state, qkv.transpose(1, 2)], dim=-1)
    mixed = gdn.causal_conv(window, conv_weight).transpose(1, 2)
    beta, g = gdn.gates(b, a, A_log, dt_bias)
    return mixed[0], window, g[0], beta[0].float()


def check_prologue(outputs, inputs):
    """outputs (window [C, K-1+T], mixed, g, beta) of the kernel against the torch path on `inputs`."""
    window, mixed, g, beta = outputs
    ref_mixed, ref_window, ref_g, ref_beta = torch_prologue(*inputs)
    assert torch.equal(window, ref_window[0]), "the conv window record is not the torch path's"
    assert_bf16_close(mixed, ref_mixed, MIXED_ULPS, "mixed")
    assert_bf16_close(beta, ref_beta, BETA_ULPS, "beta")
    torch.testing.assert_close(g, ref_g, rtol=1e-6, atol=0)
    _, _, a, _, _, _, dt_bias = inputs
    assert bool(((a.float() + dt_bias) > 20).any()), "no gate reached softplus's linear branch"


def norm_inputs(rows, hv, dv, weight_dtype, gen, device):
    """x [rows, hv, dv] bf16 at mixed scales, z a strided column slice [rows, hv * dv] (as in_proj's z),
    weight [dv] near 1."""
    x = (torch.randn(rows, hv, dv, generator=gen, device=device)
         * torch.rand(rows, hv, 1, generator=gen, device=device) * 4).to(torch.bfloat16)
    proj = torch.randn(rows, hv * dv + 40, generator=gen, device=device).to(torch.bfloat16)
    z = proj[:, 24:24 + hv * dv]
    weight = (1 + 0.2 * torch.randn(dv, generator=gen, device=device)).to(weight_dtype)
    return x, z, weight


def check_gated_norm(out, x, z, weight, eps):
    rows, hv, dv = x.shape
    ref = gdn.gated_rms_norm(x, z.reshape(rows, hv, dv), weight, eps)
    assert_bf16_close(out.reshape(rows, hv, dv), ref, NORM_ULPS, "gated norm")
