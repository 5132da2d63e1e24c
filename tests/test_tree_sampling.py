"""Tree verification at temperature > 0 keeps the target's distribution: the recursive rejection
rule over a node's children emits each token with the target's probability (chi-square on a
synthetic tree; a planted bias fails), and the engine's tree loop samples the first three tokens
with the target's joint law on tiny small-vocab pairs (dense and hybrid), with siblings accepted."""
import pytest
import torch

from batch_helpers import random_prompts, tiny_pair
from test_batch_sampling import chi2, chi2_threshold, joint_probs
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from specpilot.engine import Engine
from specpilot.engine.tree import sampling as tree_sampling
from specpilot.engine.tree.build import DraftTree
from specpilot.config import EngineConfig

TREE = DraftTree(tokens=[0, 1, 2, 3, 1, 4], parents=[-1, 0, 0, 0, 1, 1], depth=[0, 1, 1, 1, 2, 2])
V = 5


def draws_of(rule_tree, probs, n, seed):
    g = torch.Generator().manual_seed(seed)
    firsts, seconds = {}, {}                     # first emitted token; second given the first = node 1's token
    for _ in range(n):
        path, nxt = tree_sampling.sampled_path(rule_tree, probs, g)
        emitted = [rule_tree.tokens[i] for i in path[1:]] + [nxt]
        firsts[emitted[0]] = firsts.get(emitted[0], 0) + 1
        if emitted[0] == 1:
            seconds[emitted[1]] = seconds.get(emitted[1], 0) + 1
    return firsts, seconds


def target_probs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(len(TREE), V, generator=g) * 1.5, dim=-1)


def test_each_emitted_token_follows_the_target():
    seed = fresh_seed()
    probs = target_probs(seed)
    firsts, seconds = draws_of(TREE, probs, 20000, seed)
    stat, dof = chi2(firsts, {t: float(probs[0, t]) for t in range(V)}, 20000)
    assert stat < chi2_threshold(dof), f"seed {seed}: first token chi2 {stat:.1f} ({dof} dof)"
    n1 = sum(seconds.values())
    stat, dof = chi2(seconds, {t: float(probs[1, t]) for t in range(V)}, n1)   # node 1 holds token 1
    assert stat < chi2_threshold(dof), f"seed {seed}: second token chi2 {stat:.1f} ({dof} dof)"


def biased_first_law(probs) -> torch.Tensor:
    """The first emitted token's law under the rule without renormalisation (below): the root's children
    (tokens 1, 2, 3 in order) each accepted with the target's unrenormalised probability."""
    p = probs[0].double()
    law, stay, residual = torch.zeros_like(p), 1.0, p.clone()
    for child in TREE.children()[0]:
        tok = TREE.tokens[child]
        law[tok] += stay * residual[tok]
        stay, residual[tok] = stay * (1 - residual[tok]), 0.0
    return law + stay * residual / residual.sum()


def test_a_biased_rule_fails(monkeypatch):
    """Without renormalising the residual after a rejected sibling, later siblings are accepted too
    rarely: the chi-square above must see it. The target is one whose bias is large enough to be seen
    (its expected chi-square under the bias at least 3x the threshold, from the law above, chosen
    before any draw): on a random target the bias can be too small for any sample to show."""
    n, threshold = 20000, chi2_threshold(V - 1)
    for seed in range(fresh_seed(), 2**31)[:50]:
        probs = target_probs(seed)
        law, p = biased_first_law(probs), probs[0].double()
        if n * float(((law - p) ** 2 / p).sum()) >= 3 * threshold:
            break
    else:
        pytest.fail("no target in 50 seeds with a visible bias")

    def no_renormalisation(tree, target, generator=None):
        children, path = tree.children(), [0]
        while True:
            residual, accepted = target[path[-1]].clone(), None
            for child in children[path[-1]]:
                if torch.rand((), generator=generator) < residual[tree.tokens[child]]:
                    accepted = child
                    break
                residual[tree.tokens[child]] = 0
            if accepted is None:
                return path, int(torch.multinomial(residual, 1, generator=generator))
            path.append(accepted)

    monkeypatch.setattr(tree_sampling, "sampled_path", no_renormalisation)
    firsts, _ = draws_of(TREE, probs, n, seed)
    stat, dof = chi2(firsts, {t: float(probs[0, t]) for t in range(V)}, n)
    assert stat > chi2_threshold(dof), f"seed {seed}: the biased rule passed (chi2 {stat:.1f})"


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.5"])
def test_engine_tree_sampling_is_the_targets(preset):
    seed = fresh_seed()
    vocab, new, draws, temperature = 6, 3, 3000, 1.5
    target, drafter = tiny_pair(vocab, 4, seed, preset)
    prompt = random_prompts(vocab, (5,), seed)[0]
    engine = Engine(target, drafter, max_seq_len=32, config=EngineConfig(tree_budget=8))
    counts, multi = {}, 0
    for i in range(draws):
        r = engine.generate_spec(prompt, new, temperature=temperature, seed=seed * 7919 + i)
        assert len(r.tokens) == new
        counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
        multi += any(a > 1 for a in r.acceptance_lengths)
    assert multi > draws // 10, f"seed {seed}: only {multi} runs accepted a draft"
    stat, dof = chi2(counts, joint_probs(target, prompt, temperature, 1.0), draws)
    assert stat < chi2_threshold(dof), f"seed {seed}: chi2 {stat:.1f} with {dof} dof"
    wrong, wrong_dof = chi2(counts, joint_probs(target, prompt, temperature * 0.6, 1.0), draws)
    assert wrong > chi2_threshold(wrong_dof), f"seed {seed}: chi2 cannot tell T={temperature} from {temperature * 0.6}"
