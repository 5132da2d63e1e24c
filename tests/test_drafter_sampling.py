"""T > 0 end to end for the new kinds: the first new tokens under speculative sampling are distributed
as under the target's own sampling (two-sample chi-square over the 3-token continuations, ours
spec vs ours AR, 800 runs each). The pair is picked (from consecutive seeds, bounded) so that the
probe prompt's sampled continuations vary and often include accepted drafts: the continuations
then mix accepted drafts, residual samples and bonus tokens."""
import collections

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from test_engine_helpers import fresh_seed
from drafter_helpers import PROBE, KindPair

RUNS, TEMPERATURE = 800, 1.0


def _contingency_pvalue(a: collections.Counter, b: collections.Counter) -> float:
    from scipy.stats import chi2_contingency

    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rare = (sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))
    table = [[a[k] for k in keys], [b[k] for k in keys]]
    if min(rare) > 0 or max(rare) >= 10:
        table[0].append(rare[0])
        table[1].append(rare[1])
    return chi2_contingency(table).pvalue


def _sampling_pair(folder_factory, kind, tries: int = 16) -> KindPair:
    base = fresh_seed()
    for i in range(tries):
        pair = KindPair(folder_factory(), kind, base + i, preset="tiny-llama", two_token_head=True)
        runs = [pair.engine.generate_spec(PROBE, 3, temperature=TEMPERATURE, seed=s) for s in range(60)]
        accepted = sum(max(r.acceptance_lengths) > 1 for r in runs)
        if accepted >= 10 and len({tuple(r.tokens) for r in runs}) >= 5:
            return pair
    raise AssertionError(f"no {kind} pair of seeds {base}..{base + tries - 1} both varies and accepts at T > 0")


@pytest.mark.parametrize("kind", ["dflash2", "dspark", "pard"])
def test_spec_sampling_matches_ar_sampling(tmp_path_factory, kind):
    pair = _sampling_pair(lambda: tmp_path_factory.mktemp(kind), kind)
    engine, seed = pair.engine, fresh_seed()
    spec, ar, accepted = collections.Counter(), collections.Counter(), 0
    for i in range(RUNS):
        r = engine.generate_spec(PROBE, 3, temperature=TEMPERATURE, seed=seed + i)
        spec[tuple(r.tokens)] += 1
        accepted += max(r.acceptance_lengths, default=0) > 1
        ar[tuple(engine.generate_ar(PROBE, 3, temperature=TEMPERATURE, seed=seed + RUNS + i).tokens)] += 1
    assert accepted > RUNS // 20, f"only {accepted} runs accepted a draft: the test would see little"
    assert _contingency_pvalue(spec, ar) > 1e-4, f"seed {seed}: {spec.most_common(6)} vs {ar.most_common(6)}"
