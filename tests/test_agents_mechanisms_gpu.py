"""The mechanism search with the engine evaluator in bf16 on the GPU (tiny random pair): the start and
every would-be incumbent pass token_force, the CUDA mechanisms are searched, memory records them."""
import pytest
import torch

from specpilot.agents.deployment import Deployment
from specpilot.agents.engine_evaluator import EngineEvaluator
from specpilot.agents.mechanism_cli import card_name
from specpilot.agents.mechanism_search import search_mechanisms
from specpilot.agents.memory import Memory
from specpilot.models.random_ckpt import write_pair

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("concurrency", [1, 2])
def test_bf16_search_is_confirmed_by_token_forcing(tmp_path, concurrency):
    td, dd = write_pair(tmp_path / "pair", "tiny-llama", layer_ids=[1, 2], block_size=4, seed=3)
    ev = EngineEvaluator(td, dd, [[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=16, device="cuda",
                         dtype=torch.bfloat16, repeats=1)
    confirmed = []
    real = ev.confirm
    ev.confirm = lambda dep, a: confirmed.append(a) or real(dep, a)
    mem = Memory(str(tmp_path / "m.db"))
    dep = Deployment("tiny-llama", "dflash-b4", card_name("cuda"), concurrency, "bf16")
    r = search_mechanisms(dep, ev, mem, budget=8, compare_shipped=True, log=print)
    assert r.verdict == "pass" and confirmed and confirmed[0] == mem.mech_evals(deployment=dep.key)[0]["config"]
    evals = mem.mech_evals(deployment=dep.key)
    assert evals[0]["verdict"] == "pass"
    assert "engine.cuda_graphs" in evals[0]["config"] and "engine.cuda_graphs" not in r.skipped  # searched on CUDA
    assert all(e["verdict"] in ("pass", "reject", "crash") for e in evals)
