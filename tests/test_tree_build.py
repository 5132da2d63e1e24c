"""Draft trees: best-first construction under a budget, the ancestor mask / conv windows a forward
uses, the greedy accepted path, and the per-node GDN recurrence against the chain recurrence."""
import heapq
import itertools

import pytest
import torch

from specpilot.engine.tree.accept import accepted_on_device, accepted_path
from specpilot.engine.tree.build import DraftTree, build_tree, grow_tree, tree_size
from specpilot.engine.tree.layout import TreeLayout
from specpilot.models import gdn, gdn_tree


def logits_with(ranked: list, vocab: int = 50) -> torch.Tensor:
    """[D, V] logits whose depth d puts ranked[d-1]'s (token, logit) pairs above a -10 floor."""
    out = torch.full((len(ranked), vocab), -10.0)
    for d, pairs in enumerate(ranked):
        for tok, value in pairs:
            out[d, tok] = value
    return out


def test_confident_drafter_gets_the_chain():
    tree = build_tree(logits_with([[(5, 10.0)], [(6, 10.0)], [(7, 10.0)]]), anchor=1, budget=4)
    assert tree == DraftTree([1, 5, 6, 7], [-1, 0, 1, 2], [0, 1, 2, 3])


def test_hesitant_depth_gets_a_sibling():
    # depth 1 split between 5 and 9 (~0.52 / 0.48), later depths sure: the path through 5 first (its
    # deeper nodes cost almost nothing), then 9 and the sure path below it
    tree = build_tree(logits_with([[(5, 5.1), (9, 5.0)], [(6, 10.0)], [(7, 10.0)]]), anchor=1, budget=6)
    assert tree == DraftTree([1, 5, 6, 7, 9, 6], [-1, 0, 1, 2, 0, 4], [0, 1, 2, 3, 1, 2])


@pytest.mark.parametrize("budget", [1, 2, 7, 32, 64])
def test_tree_shape_invariants(budget):
    g = torch.Generator().manual_seed(budget)
    tree = build_tree(torch.randn(15, 40, generator=g) * 3, anchor=3, budget=budget)
    assert len(tree) == budget                                  # 15 x 40 candidates: the budget fills
    assert tree.parents[0] == -1 and tree.depth[0] == 0 and tree.tokens[0] == 3
    for i in range(1, len(tree)):
        p = tree.parents[i]
        assert 0 <= p < i and tree.depth[i] == tree.depth[p] + 1 and tree.depth[i] <= 15
    children = tree.children()
    for kids in children:
        assert len({tree.tokens[c] for c in kids}) == len(kids)     # siblings differ


def best_first(draft_logits, anchor: int, budget: int) -> DraftTree:
    """The rule restated as heap growth (float64 scores): pop the best candidate, whose candidates are
    its next sibling rank and its first child."""
    logp, ids = torch.log_softmax(draft_logits.double(), dim=-1).sort(dim=-1, descending=True)
    tokens, parents, depth, score, heap, order = [anchor], [-1], [0], [0.0], [], itertools.count()

    def push(parent, rank):
        if depth[parent] < logp.shape[0] and rank < logp.shape[1]:
            heapq.heappush(heap, (-(score[parent] + logp[depth[parent], rank].item()), next(order), parent, rank))

    push(0, 0)
    while heap and len(tokens) < budget:
        neg, _, parent, rank = heapq.heappop(heap)
        tokens.append(int(ids[depth[parent], rank]))
        parents.append(parent)
        depth.append(depth[parent] + 1)
        score.append(-neg)
        push(parent, rank + 1)
        push(len(tokens) - 1, 0)
    return DraftTree(tokens, parents, depth)


@pytest.mark.parametrize("depths,vocab,budget", [(15, 40, 32), (15, 8192, 16), (15, 300, 64), (3, 5, 64), (1, 7, 16)])
def test_grow_tree_is_best_first_growth(depths, vocab, budget):
    # tie-free scores (random logits): the static-shape selection equals growing the tree node by node
    g = torch.Generator().manual_seed(depths * 1000 + budget)
    for _ in range(3):
        logits = torch.randn(depths, vocab, generator=g, dtype=torch.float64) * 3
        tree = build_tree(logits, anchor=7, budget=budget)
        assert tree == best_first(logits, 7, budget)
        assert len(tree) == tree_size(depths, vocab, budget)


def test_grow_tree_paths_and_ties():
    # uniform logits: every score ties; the order still puts parents first and siblings apart
    tree = grow_tree(torch.zeros(4, 6), anchor=2, budget=20)
    host = tree.to_host()
    assert len(host) == 20 and host.depth[1:] == sorted(host.depth[1:])   # equal scores: shallower first
    for i in range(len(host)):
        assert tree.path[i, :host.depth[i] + 1].tolist() == host.path_to(i)
        assert (tree.path[i, host.depth[i] + 1:] == len(host)).all()


@pytest.mark.parametrize("depths,budget", [(1, 16), (3, 32), (14, 8)])
def test_padded_rows_stay_out_of_the_tree(depths, budget):
    # a tail block in a graph of 15 rows: rows past `depths` are padding (here: logits that would win)
    g = torch.Generator().manual_seed(depths)
    logits = torch.randn(depths, 50, generator=g) * 3
    padded = torch.cat([logits, torch.full((15 - depths, 50), 30.0)])
    plain = grow_tree(logits, 4, budget)
    masked = grow_tree(padded, 4, budget, depths=torch.tensor([depths]))
    assert tree_size(depths, 50, budget) == tree_size(15, 50, budget) == budget
    assert masked.to_host() == plain.to_host()
    assert torch.equal(masked.path[:, :depths + 1], plain.path) and (masked.path[:, depths + 1:] == budget).all()


def test_budget_and_input_errors():
    with pytest.raises(ValueError, match="budget 0"):
        build_tree(torch.zeros(3, 10), 0, 0)
    with pytest.raises(ValueError, match="depths, vocab"):
        build_tree(torch.zeros(10), 0, 4)
    assert len(build_tree(torch.zeros(0, 10), 2, 16)) == 1     # nothing to draft: the anchor alone


TREE = DraftTree(tokens=[1, 5, 9, 6, 7, 8], parents=[-1, 0, 0, 1, 3, 2], depth=[0, 1, 1, 2, 3, 2])


def test_ancestor_mask_and_positions():
    layout = TreeLayout(TREE, start=10, device="cpu")
    assert layout.slots.tolist() == list(range(10, 16))
    assert layout.rope_positions.tolist() == [10, 11, 11, 12, 13, 12]
    mask = layout.attention_mask(16, groups=2, dtype=torch.float32).additive[0, 0]       # [2*6, 16]
    assert mask.shape == (12, 16) and torch.equal(mask[:6], mask[6:])
    visible = (mask[:6] == 0)
    assert visible[:, :10].all()
    want = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 3, 4], 5: [0, 2, 5]}
    for i, anc in want.items():
        assert [j for j in range(6) if visible[i, 10 + j]] == anc
    longer = layout.attention_mask(20, groups=1, dtype=torch.float32).additive[0, 0]    # a graph's kv span
    assert torch.equal(longer[:, :16], mask[:6]) and (longer[:, 16:] == float("-inf")).all()
    with pytest.raises(ValueError, match="kv_len"):
        layout.attention_mask(15, 1, torch.float32)


def test_conv_windows_follow_ancestors():
    layout = TreeLayout(TREE, start=10, device="cpu")
    idx = layout.conv_window_index(4).tolist()       # [3 committed inputs 0..2 | nodes at 3 + i]
    assert idx[0] == [0, 1, 2, 3]
    assert idx[4] == [3, 4, 6, 7]                     # node 4: root, 1, 3, itself
    assert idx[5] == [2, 3, 5, 8]                     # node 5: committed input 2, root, 2, itself


def test_accepted_path_follows_the_argmax():
    # argmax at root 5 -> node 1; at node 1 6 -> node 3; at node 3 4 (no such child) -> bonus 4
    assert accepted_path(TREE, [5, 6, 0, 4, 0, 0]) == ([0, 1, 3], 4)
    assert accepted_path(TREE, [9, 0, 8, 0, 0, 3]) == ([0, 2, 5], 3)
    assert accepted_path(TREE, [2, 0, 0, 0, 0, 0]) == ([0], 2)
    with pytest.raises(ValueError, match="rows"):
        accepted_path(TREE, [1, 2])


def test_accepted_on_device_is_the_host_rule():
    g = torch.Generator().manual_seed(5)
    for budget in (2, 16, 32):
        tensors = grow_tree(torch.randn(6, 12, generator=g) * 2, anchor=4, budget=budget)
        tree = tensors.to_host()
        for trial in range(20):
            argmax = torch.randint(0, 12, (len(tree),), generator=g)
            if trial % 2:           # follow a random root-to-leaf walk, so that long paths are accepted
                node = 0
                while tree.children()[node]:
                    child = tree.children()[node][int(torch.randint(0, len(tree.children()[node]), (1,), generator=g))]
                    argmax[node] = tree.tokens[child]
                    node = child
            path, bonus = accepted_path(tree, argmax.tolist())
            out = accepted_on_device(tensors, argmax).tolist()
            assert out[:2] == [len(path) - 1, bonus] and out[2:2 + len(path)] == path
            assert all(x == len(tree) for x in out[2 + len(path):])


def test_tree_recurrence_equals_the_chain_along_every_path():
    g = torch.Generator().manual_seed(0)
    n, h, dk, dv = len(TREE), 2, 8, 4
    q, k = torch.randn(1, n, h, dk, generator=g), torch.randn(1, n, h, dk, generator=g)
    v = torch.randn(1, n, h, dv, generator=g)
    decay, beta = -torch.rand(1, n, h, generator=g), torch.rand(1, n, h, generator=g)
    state = torch.randn(1, h, dk, dv, generator=g)
    out, states = gdn_tree.tree_gated_delta_rule(q, k, v, decay, beta, state, TreeLayout(TREE, 5, "cpu"))
    for leaf in (4, 5):
        path = TREE.path_to(leaf)
        chain_out, _, chain_states = gdn.recurrent_gated_delta_rule(
            q[:, path], k[:, path], v[:, path], decay[:, path], beta[:, path], state, keep_states=True)
        assert torch.equal(out[:, path], chain_out) and torch.equal(states[:, path], chain_states)


def test_tree_conv_equals_the_chain_conv_along_a_path():
    g = torch.Generator().manual_seed(1)
    n, c, width = len(TREE), 6, 4
    qkv, past = torch.randn(1, n, c, generator=g), torch.randn(1, c, width - 1, generator=g)
    weight = torch.randn(c, width, generator=g)
    layout = TreeLayout(TREE, 5, "cpu")
    out, windows = gdn_tree.tree_conv(qkv, past, weight, layout.conv_window_index(width))
    path = TREE.path_to(4)
    chain_window = torch.cat([past, qkv[:, path].transpose(1, 2)], dim=-1)
    torch.testing.assert_close(out[:, path], gdn.causal_conv(chain_window, weight).transpose(1, 2),
                               rtol=0, atol=1e-6)
    assert torch.equal(windows[:, :, 4, 1:], chain_window[:, :, -(width - 1):])    # the state a commit takes
