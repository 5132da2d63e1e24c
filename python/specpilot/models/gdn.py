"""Gated DeltaNet maths (the recurrent layers of Qwen3.5 / Qwen3-Next), in plain torch.

Per value head, with state S [Dk, Dv] (fp32), decay g_t <= 0 (log space), beta_t in (0, 1), and q, k
L2-normalised (q also scaled by Dk^-1/2):
    S   <- exp(g_t) S
    u_t  = beta_t (v_t - S^T k_t)          the delta: what S does not yet predict for k_t
    S   <- S + k_t u_t^T
    o_t  = S^T q_t
`recurrent_gated_delta_rule` runs this token by token and can keep the state after every token (the
per-position snapshots a verify step commits from). `chunked_gated_delta_rule` is the same map over
chunks of up to 64 tokens (the WY form: within a chunk, with G the cumulative decay,
(I + A) U = beta V - (beta e^G K) S_0 with A_tj = beta_t e^{G_t - G_j} k_t.k_j for j < t, solved as one
unit lower-triangular system) for the prefill; it keeps only the final state. Both equal to fp32
rounding (tests/test_gdn.py).

Layout: q, k [B, T, H, Dk], v [B, T, H, Dv], g, beta [B, T, H] (q, k already repeated to the value
heads), state [B, H, Dk, Dv]. Outputs [B, T, H, Dv] in v's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (fla's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta):
    """L2-normalise q and k (in their dtype, as transformers' torch path does), move heads before time,
    go to fp32 and scale q: -> q, k, v [B, H, T, D], g, beta [B, H, T]."""
    q, k = l2norm(q), l2norm(k)
    q, k, v, g, beta = (x.transpose(1, 2).contiguous().float() for x in (q, k, v, g, beta))
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def _initial(state, b, h, dk, dv, device):
    if state is None:
        return torch.zeros(b, h, dk, dv, dtype=torch.float32, device=device)
    return state.float()


def recurrent_gated_delta_rule(q, k, v, g, beta, state=None, keep_states: bool = False, states_out=None):
    """Token by token. Returns (out [B, T, H, Dv], final state [B, H, Dk, Dv] fp32, states
    [B, T, H, Dk, Dv] fp32 (the state after each token) when keep_states, else None). states_out: an
    fp32 [B, T, H, Dk, Dv] tensor the kept states are written into (else a new one)."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    s = _initial(state, b, h, dk, dv, k.device)
    out = torch.empty(b, h, t, dv, dtype=torch.float32, device=k.device)
    states = None
    if keep_states:
        states = _states_buffer(states_out, (b, t, h, dk, dv), k.device)
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        predicted = (k[:, :, i, None, :] @ s).squeeze(-2)                      # S^T k  [B, H, Dv]
        u = (v[:, :, i] - predicted) * beta[:, :, i, None]
        s = s + k[:, :, i, :, None] * u[:, :, None, :]
        out[:, :, i] = (q[:, :, i, None, :] @ s).squeeze(-2)
        if keep_states:
            states[:, i] = s
    return out.transpose(1, 2).to(dtype), s, states


def _states_buffer(states_out, shape, device):
    if states_out is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    if tuple(states_out.shape) != shape or states_out.dtype != torch.float32:
        raise ValueError(f"states_out must be fp32 {list(shape)}, got {states_out.dtype} {list(states_out.shape)}")
    return states_out


def chunked_gated_delta_rule(q, k, v, g, beta, state=None, chunk: int = CHUNK):
    """Chunk by chunk (WY form). Returns (out [B, T, H, Dv], final state [B, H, Dk, Dv] fp32)."""
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    s = _initial(state, b, h, dk, dv, k.device)
    out = torch.empty(b, h, t, dv, dtype=torch.float32, device=k.device)
    for c0 in range(0, t, chunk):
        c1 = min(c0 + chunk, t)
        n = c1 - c0
        qc, kc, vc, bc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], beta[:, :, c0:c1]
        cum = g[:, :, c0:c1].cumsum(dim=-1)                                     # G_t  [B, H, n]
        lower = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()      # j <= t
        diff = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf"))
        decay = diff.exp()                                                      # e^{G_t - G_j}, j <= t
        strict = torch.eye(n, dtype=torch.bool, device=k.device) | ~lower       # keep j < t only
        a = ((kc @ kc.transpose(-1, -2)) * decay * bc[..., None]).masked_fill(strict, 0.0)
        system = a + torch.eye(n, dtype=torch.float32, device=k.device)
        rhs = torch.cat([vc * bc[..., None], kc * (bc * cum.exp())[..., None]], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u = solved[..., :dv] - solved[..., dv:] @ s                             # U = U0 - W S_0
        scores = (qc @ kc.transpose(-1, -2)) * decay                            # causal, decayed
        out[:, :, c0:c1] = (qc * cum.exp()[..., None]) @ s + scores @ u
        tail = (cum[..., -1:] - cum).exp()                                      # e^{G_n - G_j}
        s = s * cum[..., -1].exp()[..., None, None] + (kc * tail[..., None]).transpose(-1, -2) @ u
    return out.transpose(1, 2).to(dtype), s


def causal_conv(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv + SiLU over a window [B, C, K-1+T] (the K-1 previous inputs, then the T
    new ones), weight [C, K] -> [B, C, T]."""
    out = F.conv1d(window.to(weight.dtype), weight[:, None, :], groups=weight.shape[0])
    return F.silu(out).to(window.dtype)


def gates(b: torch.Tensor, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """The GDN gates from the projection's b, a [..., H] and the per-head parameters: (beta =
    sigmoid(b) in b's dtype, log decay g = -exp(A_log) * softplus(a + dt_bias) <= 0 in fp32)."""
    return b.sigmoid(), -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (fp32 statistics, cast back, times weight) then times silu(gate) in
    fp32, cast back (transformers' Qwen3NextRMSNormGated arithmetic)."""
    dtype = x.dtype
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * normed.to(dtype)) * F.silu(gate.float())).to(dtype)
