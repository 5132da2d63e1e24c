"""The Gated DeltaNet tree kernels (csrc/cuda/gdn_chain.cu's parent-indexed recurrence,
csrc/cuda/gdn_tree_conv.cu) on the GPU: a chain-shaped tree equals the chain kernel bit for bit;
random trees of 16-64 nodes match the torch reference (models/gdn_tree.py); a bad parent poisons only
its node and descendants; bad inputs are refused; and the hybrid tree engine in bf16 with the kernels
decodes as AR does. Outputs are poisoned with NaN first. Skipped on CPU.

Tolerances. Recurrence: as the chain kernel's (tests/test_gdn_gpu.py): fp32 throughout with another
summation order (states 1e-4 relative to their scale), then one bf16 rounding of the output. Conv:
windows exactly equal (a gather); the output within one bf16 rounding of the pre-activation (the
kernel's fp32 sum may round to the other neighbour) carried through the SiLU (slope <= 1.1) plus one
rounding of the output: |out - ref| <= 2^-7 (1.1 |pre| + |ref|)."""
import pytest
import torch

from conftest import requires_gpu
from test_engine_helpers import fresh_seed
from specpilot.engine.tree.build import DraftTree
from specpilot.engine.tree.layout import TreeLayout
from specpilot.models import gdn_tree

pytestmark = requires_gpu


def inputs(n, nk, hv, dk, dv, g):
    mixed = torch.randn(n, 2 * nk * dk + hv * dv, generator=g, device="cuda").to(torch.bfloat16)
    decay = -torch.rand(n, hv, generator=g, device="cuda") * 2
    beta = torch.rand(n, hv, generator=g, device="cuda").to(torch.bfloat16).float()
    state = torch.randn(hv, dk, dv, generator=g, device="cuda") * 0.1
    return mixed, decay, beta, state


def random_tree(n, g):
    """Node i's parent: i - 1 half the time (spines the kernel continues in registers), else any
    earlier node (branches it reloads)."""
    parents = [-1]
    for i in range(1, n):
        spine = torch.rand(1, generator=g).item() < 0.5
        parents.append(i - 1 if spine else int(torch.randint(0, i, (1,), generator=g)))
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    return DraftTree(list(range(n)), parents, depth)


def poisoned(n, hv, dk, dv):
    return (torch.full((n, hv, dk, dv), float("nan"), device="cuda"),
            torch.full((n, hv, dv), float("nan"), device="cuda", dtype=torch.bfloat16))


def run_tree(mixed, nk, dk, decay, beta, state, parents):
    states, out = poisoned(mixed.shape[0], state.shape[0], dk, state.shape[2])
    torch.ops.specpilot.gdn_tree(mixed, nk, dk, decay, beta, state, parents, states, out)
    return out, states


def reference(mixed, nk, dk, decay, beta, state, layout):
    n, hv, dv = mixed.shape[0], state.shape[0], state.shape[2]
    q, k, v = mixed.float()[None].split((nk * dk, nk * dk, hv * dv), dim=-1)
    q, k = (y.reshape(1, n, nk, dk).repeat_interleave(hv // nk, dim=2) for y in (q, k))
    out, states = gdn_tree.tree_gated_delta_rule(q, k, v.reshape(1, n, hv, dv), decay[None], beta[None], state[None],
                                                 layout)
    return out[0], states[0]


def assert_matches(out, states, ref_out, ref_states):
    scale = ref_states.abs().amax()
    torch.testing.assert_close(states, ref_states, atol=1e-4 * float(scale), rtol=1e-4)
    torch.testing.assert_close(out.float(), ref_out, atol=1e-3 * float(ref_out.abs().amax()), rtol=2 ** -8)


@pytest.fixture(autouse=True)
def the_kernels_are_built():
    from specpilot.kernels import gdn_tree as kernels

    assert kernels.available(), "the extension was built without gdn_tree / gdn_tree_conv"


@pytest.mark.parametrize("n", [1, 2, 16, 17, 64])
@pytest.mark.parametrize("nk, hv, dk, dv", [(4, 8, 64, 64), (16, 32, 128, 128), (16, 48, 128, 128), (2, 2, 128, 96)])
def test_chain_shaped_tree_equals_the_chain_kernel_exactly(n, nk, hv, dk, dv):
    g = torch.Generator(device="cuda").manual_seed(fresh_seed())
    mixed, decay, beta, state = inputs(n, nk, hv, dk, dv, g)
    chain_states, chain_out = poisoned(n, hv, dk, dv)
    torch.ops.specpilot.gdn_chain(mixed, nk, dk, decay, beta, state, chain_states, chain_out)
    out, states = run_tree(mixed, nk, dk, decay, beta, state, torch.arange(-1, n - 1, device="cuda"))
    assert torch.equal(out, chain_out) and torch.equal(states, chain_states)


@pytest.mark.parametrize("n", [16, 33, 64])
@pytest.mark.parametrize("nk, hv, dk, dv", [(4, 8, 64, 64), (16, 32, 128, 128), (16, 48, 128, 128), (2, 2, 128, 96)])
def test_random_tree_matches_the_reference(n, nk, hv, dk, dv):
    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    tree = random_tree(n, torch.Generator().manual_seed(seed))
    layout = TreeLayout(tree, 5, "cuda")
    mixed, decay, beta, state = inputs(n, nk, hv, dk, dv, g)
    out, states = run_tree(mixed, nk, dk, decay, beta, state, layout.parents)
    assert_matches(out, states, *reference(mixed, nk, dk, decay, beta, state, layout))


def test_bushy_tree_matches_the_reference():
    """Every node a child of the root or of node 1: a reload at almost every node."""
    n, nk, hv, dk, dv = 40, 16, 32, 128, 128
    parents = [-1, 0] + [i % 2 for i in range(2, n)]
    tree = DraftTree(list(range(n)), parents, [0] + [1 + p for p in parents[1:]])
    layout = TreeLayout(tree, 3, "cuda")
    mixed, decay, beta, state = inputs(n, nk, hv, dk, dv, torch.Generator(device="cuda").manual_seed(fresh_seed()))
    out, states = run_tree(mixed, nk, dk, decay, beta, state, layout.parents)
    assert_matches(out, states, *reference(mixed, nk, dk, decay, beta, state, layout))


def test_a_bad_parent_poisons_its_node_and_descendants_only():
    nk, hv, dk, dv = 2, 4, 64, 64
    parents = torch.tensor([-1, 0, 1, 9, 3, 1], device="cuda")          # node 3's parent comes after it
    mixed, decay, beta, state = inputs(6, nk, hv, dk, dv, torch.Generator(device="cuda").manual_seed(fresh_seed()))
    out, states = run_tree(mixed, nk, dk, decay, beta, state, parents)
    assert out[3:5].isnan().all() and states[3:5].isnan().all()
    good = [0, 1, 2, 5]
    assert not out[good].isnan().any() and not states[good].isnan().any()
    tree = DraftTree(list(range(6)), [-1, 0, 1, 2, 3, 1], [0, 1, 2, 3, 4, 2])  # node 5 is unaffected by node 3
    ref_out, ref_states = reference(mixed, nk, dk, decay, beta, state, TreeLayout(tree, 1, "cuda"))
    assert_matches(out[good], states[good], ref_out[good], ref_states[good])


def test_bad_inputs_are_refused():
    g = torch.Generator(device="cuda").manual_seed(0)
    mixed, decay, beta, state = inputs(4, 2, 4, 64, 64, g)
    parents = torch.arange(-1, 3, device="cuda")
    states, out = poisoned(4, 4, 64, 64)
    with pytest.raises(RuntimeError, match="parents must be Long"):
        torch.ops.specpilot.gdn_tree(mixed, 2, 64, decay, beta, state, parents.int(), states, out)
    with pytest.raises(RuntimeError, match="parents must have shape"):
        torch.ops.specpilot.gdn_tree(mixed, 2, 64, decay, beta, state, parents[:3], states, out)
    with pytest.raises(RuntimeError, match="a tree of 1..64 nodes"):
        big = inputs(65, 2, 4, 64, 64, g)
        torch.ops.specpilot.gdn_tree(big[0], 2, 64, big[1], big[2], big[3], torch.arange(-1, 64, device="cuda"),
                                     *poisoned(65, 4, 64, 64))
    with pytest.raises(RuntimeError, match="key_head_dim must be 64 or 128"):
        torch.ops.specpilot.gdn_tree(mixed, 2, 32, decay, beta, state, parents, states, out)
    qkv = torch.randn(4, 96, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(96, 4, device="cuda", dtype=torch.bfloat16)
    conv_state = torch.randn(96, 3, device="cuda", dtype=torch.bfloat16)
    index = torch.zeros(4, 4, dtype=torch.long, device="cuda")
    windows, y = torch.empty(4, 4, 96, device="cuda", dtype=torch.bfloat16), torch.empty_like(qkv)
    with pytest.raises(RuntimeError, match="weight must be BFloat16"):
        torch.ops.specpilot.gdn_tree_conv(qkv, conv_state, weight.float(), index, windows, y)
    with pytest.raises(RuntimeError, match="conv_state must have shape"):
        torch.ops.specpilot.gdn_tree_conv(qkv, conv_state[:, :2].contiguous(), weight, index, windows, y)
    with pytest.raises(RuntimeError, match="windows must have shape"):
        torch.ops.specpilot.gdn_tree_conv(qkv, conv_state, weight, index, windows.transpose(0, 2).contiguous(), y)


@pytest.mark.parametrize("n, width", [(1, 4), (16, 4), (64, 4), (33, 2)])
def test_tree_conv_matches_the_reference(n, width):
    from specpilot.kernels import gdn_tree as kernels

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    c = 8192 + 96                                                   # not a multiple of the CTA's 256 channels
    layout = TreeLayout(random_tree(n, torch.Generator().manual_seed(seed)), 7, "cuda")
    proj = torch.randn(1, n, c + 300, generator=g, device="cuda").to(torch.bfloat16)
    qkv = proj[:, :, 100:100 + c]                                   # a strided view, as the projection's split
    conv_state = torch.randn(1, c, width - 1, generator=g, device="cuda").to(torch.bfloat16)
    weight = (torch.randn(c, width, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
    index = layout.conv_window_index(width)
    ref_out, ref_windows = gdn_tree.tree_conv(qkv, conv_state, weight, index)
    out, windows = kernels.tree_conv(qkv[0], conv_state[0], weight, index)
    assert torch.equal(windows, ref_windows[0])
    pre = (windows.double() * weight.double()[:, None, :]).sum(-1).T       # [N, C], exact sums
    bound = 2 ** -7 * (1.1 * pre.abs() + ref_out[0].double().abs())
    assert ((out.double() - ref_out[0].double()).abs() <= bound).all()


def test_hybrid_tree_engine_in_bf16_decodes_as_ar(tmp_path, monkeypatch):
    """A tiny random hybrid (dk = dv = 64, so the kernels take its layers) with a drafter, in bf16 on
    CUDA, oracle drafts so that trees accept through siblings: the tree loop's tokens equal AR's.
    Both runs are bf16 with different kernels (tree: the tree kernels and masked attention; AR: one
    token at a time), so where they part, AR's own logits must show a near-tie there (the tree's token
    within 4 bf16 ulps of AR's top logit), and the test says where; a state bug parts elsewhere."""
    import dataclasses

    from tree_helpers import oracle_drafts, tree_budget
    from specpilot.engine import Engine
    from specpilot.kernels import gdn_tree as kernels
    from specpilot.models import load_drafter, load_target
    from specpilot.models.random_ckpt import HYBRID_PRESETS, write_pair
    from specpilot.verify.forcing import forced_decode_logits

    seed = fresh_seed()
    cfg = dataclasses.replace(HYBRID_PRESETS["tiny-qwen3.5"], linear_key_head_dim=64, linear_value_head_dim=64)
    tdir, ddir = write_pair(tmp_path, cfg, drafter_layers=2, block_size=16, seed=seed, layer_ids=[0, 1])
    target = load_target(tdir, device="cuda", dtype=torch.bfloat16)
    engine = Engine(target, load_drafter(ddir, target), max_seq_len=512)
    calls = []
    real = kernels.tree_recurrence
    monkeypatch.setattr(kernels, "tree_recurrence", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(seed)
    for trial in range(3):
        prompt = torch.randint(0, target.eos_token_ids[0], (12,), generator=g).tolist()
        ar = engine.generate_ar(prompt, 48).tokens
        for budget in (16, 32, 64):
            with oracle_drafts(engine, len(prompt), ar), tree_budget(engine, budget):
                tree = engine.generate_spec(prompt, 48).tokens
            if tree == ar:
                continue
            i = next(j for j, (a, b) in enumerate(zip(ar, tree)) if a != b)
            logits = forced_decode_logits(engine, prompt, ar[:i + 1])[i].float()
            ulp = 2.0 ** (torch.floor(torch.log2(logits.abs().amax())) - 7)
            gap = float(logits[ar[i]] - logits[tree[i]])
            assert gap <= 4 * ulp, (f"seed {seed}, trial {trial}, budget {budget}: the tree left AR at token {i} "
                                    f"where AR's margin is {gap:.4f} (> 4 bf16 ulps = {4 * float(ulp):.4f})")
    assert calls, "the tree kernels never ran: the engine took the torch path"
