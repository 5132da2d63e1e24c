"""bench/hybrid_kernel_counts.py on the CPU: the launch rule (views and allocations are free, a reshape
that copies is not) and the counts of one bf16 decode step with the compact forms on vs off: fewer ops in
exactly the parts they replace (the norms with their residual adds, the attention mixer), the same
elsewhere."""
import pytest
import torch

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot.bench import hybrid_kernel_counts as hkc


def test_views_and_allocations_launch_nothing():
    counter = hkc._Counter()
    x = torch.randn(4, 6)
    with counter:
        x.view(6, 4), x.t(), x[:, :2], torch.empty(3)
    assert counter.counts == {}
    with counter:
        x.t().reshape(24), x + 1, x.to(torch.bfloat16), x.to(torch.float32)
    assert counter.counts["step"] == 3, counter.names                  # the copying reshape, the add, one cast


@pytest.mark.parametrize("tokens", [1, 4])
def test_compact_forms_cut_ops_only_where_they_apply(tokens):
    counts = hkc.cpu_counts("tiny-qwen3.5", tokens=tokens)
    on, off = counts["on"]["per_layer"], counts["off"]["per_layer"]
    assert set(on) == set(off) == {f"{k}.{p}" for k in ("gdn", "attention") for p in ("attn_norm", "mixer",
                                                                                      "mlp_norm", "mlp")}
    for part in ("gdn.mlp_norm", "attention.attn_norm", "attention.mlp_norm", "attention.mixer"):
        assert on[part] < off[part], (part, on[part], off[part])
    assert counts["on"]["final_norm"] < counts["off"]["final_norm"]
    for part in ("gdn.mixer", "gdn.mlp", "attention.mlp"):
        assert on[part] == off[part], part
    assert counts["on"]["total"] < counts["off"]["total"]


def test_a_preset_without_attention_layers_is_refused():
    with pytest.raises(ValueError, match="needs GDN and attention layers"):
        hkc.cpu_counts("tiny-qwen3.5", layers=1)
