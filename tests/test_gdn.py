"""Gated DeltaNet maths (models/gdn.py): the chunked form equals the recurrent one, both equal
transformers' torch references, and the per-position states are the states of the prefixes."""
import pytest
import torch

from specpilot.models import gdn


def inputs(t, seed, b=2, hk=2, hv=4, dk=8, dv=6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hv, dk, generator=g)
    k = torch.randn(b, t, hv, dk, generator=g)
    v = torch.randn(b, t, hv, dv, generator=g)
    gate = -torch.rand(b, t, hv, generator=g) * 2          # log decay in (-2, 0]
    beta = torch.rand(b, t, hv, generator=g)
    state = torch.randn(b, hv, dk, dv, generator=g)
    return q, k, v, gate, beta, state


@pytest.mark.parametrize("t", [1, 5, 64, 150])
def test_chunked_equals_recurrent(t):
    q, k, v, g, beta, state = inputs(t, seed=t)
    out_r, s_r, _ = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, state)
    out_c, s_c = gdn.chunked_gated_delta_rule(q, k, v, g, beta, state)
    torch.testing.assert_close(out_c, out_r, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(s_c, s_r, atol=2e-5, rtol=2e-5)
    assert out_r.abs().max() > 0.1                           # not a vacuous comparison


def test_snapshots_are_the_prefix_states():
    q, k, v, g, beta, state = inputs(9, seed=3)
    _, final, states = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, state, keep_states=True)
    assert torch.equal(states[:, -1], final)
    for n in (1, 4, 9):
        _, s_n = gdn.chunked_gated_delta_rule(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], state)
        torch.testing.assert_close(states[:, n - 1], s_n, atol=2e-5, rtol=2e-5)
    assert not torch.allclose(states[:, 0], states[:, 1])


@pytest.mark.parametrize("t", [1, 7, 70])
def test_equals_transformers_reference(t):
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, g, beta, state = inputs(t, seed=100 + t)
    ref_out, ref_state = hf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state.clone(),
                                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, s, _ = gdn.recurrent_gated_delta_rule(q, k, v, g, beta, state)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, ref_state, atol=1e-5, rtol=1e-5)
    ref_out, ref_state = hf.torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state.clone(),
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, s = gdn.chunked_gated_delta_rule(q, k, v, g, beta, state)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(s, ref_state, atol=2e-5, rtol=2e-5)


def test_conv_window_equals_transformers_conv():
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 12, 10, generator=g), torch.randn(12, 4, generator=g)
    zeros = torch.zeros(1, 12, 3)
    ours = gdn.causal_conv(torch.cat([zeros, x], dim=-1), w)
    torch.testing.assert_close(ours, hf.causal_conv1d_fn(x, w, None, activation="silu"))
    state = torch.cat([zeros, x[..., :7]], dim=-1)[..., -3:].clone()   # HF-style state: last 3 inputs
    step = hf.causal_conv1d_update(x[..., 7:], state, w, None, activation="silu")
    torch.testing.assert_close(step, ours[..., 7:])
