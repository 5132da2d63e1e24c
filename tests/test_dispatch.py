"""kernels/dispatch.py: the engine's hook to agent-integrated variants (registry in a temp cache)."""
import pytest
import torch
from conftest import requires_gpu
from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread, deterministic sums)

from specpilot.kernels import registry
from specpilot.kernels.dispatch import integrated_launcher


@pytest.fixture
def temp_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_KERNEL_CACHE", str(tmp_path / "kernels"))
    return tmp_path


def _integrate(gpu: str, shape, params: dict) -> dict:
    """What agents/integrate.py writes for a CUDA winner: source next to the cache, record in the registry."""
    from specpilot import settings
    from specpilot.agents.candidates import gemv_candidate

    cand = gemv_candidate(shape, params, "test", "cuda")
    folder = settings.get().kernel_cache / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cand.cand_id}.cu"
    path.write_text(cand.source)
    record = {"cand_id": cand.cand_id, "label": cand.label, "params": cand.params, "kind": "cuda",
              "source_path": str(path)}
    registry.integrate_variant(gpu, "split12_gemv", shape, record)
    return record


def manifest() -> str:
    return str(registry.variants_file())


def test_cpu_gets_no_launcher_even_with_an_entry(temp_registry):
    registry.integrate_variant("cpu", "split12_gemv", (64, 96), {"cand_id": "x", "kind": "cpu", "params": {}})
    assert integrated_launcher("split12_gemv", (64, 96), "cpu", manifest()) is None
    assert integrated_launcher("split12_gemv", (64, 96), torch.device("cpu"), manifest()) is None


def test_no_manifest_means_no_variant_and_a_missing_one_is_named(temp_registry):
    from specpilot import config

    registry.integrate_variant("cuda-gpu", "split12_gemv", (64, 96), {"cand_id": "x", "kind": "cuda", "params": {}})
    assert config.current().variants_manifest is None
    assert integrated_launcher("split12_gemv", (64, 96), "cuda") is None    # the default config names none
    missing = str(temp_registry / "absent.json")
    with config.use(config.EngineConfig(variants_manifest=missing)):
        with pytest.raises(FileNotFoundError, match="absent.json"):
            integrated_launcher("split12_gemv", (64, 96), "cuda")


def test_bad_arguments_name_the_bad_values(temp_registry):
    with pytest.raises(ValueError, match="'bf16_gemm'"):
        integrated_launcher("bf16_gemm", (64, 96), "cpu")
    with pytest.raises(ValueError, match=r"\(64,\)"):
        integrated_launcher("split12_gemv", (64,), "cpu")


@requires_gpu
def test_gpu_launcher_only_for_an_integrated_shape_and_it_is_graph_capturable(temp_registry):
    pytest.importorskip("cupy")
    from specpilot.agents.gaps import gpu_name
    from specpilot.kernels.variants.split12_args import contract_args, pack

    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    n, k = 384, 1000                        # K not a multiple of 32: padding columns exercised
    assert integrated_launcher("split12_gemv", (n, k), "cuda") is None        # no manifest named
    _integrate(gpu_name("cuda"), (n, k), {"threads_per_row": 32, "rows_per_block": 4, "vec_groups": 2, "unroll": 1})
    assert integrated_launcher("split12_gemv", (n, k + 1), "cuda", manifest()) is None    # another shape
    launch = integrated_launcher("split12_gemv", (n, k), "cuda", manifest())
    assert callable(launch)

    w = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
    a = pack(w)
    x = torch.randn(1, k, generator=gen, device="cuda").to(torch.bfloat16)    # [1, K]
    out = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device="cuda")  # [1, N]
    launch(x, *contract_args(a), out)
    torch.cuda.synchronize()
    ref = w.double() @ x[0].double()                                         # [N]
    s = w.double().abs() @ x[0].double().abs()
    gamma = k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
    assert ((out[0].double() - ref).abs() <= gamma * s + 2.0 ** -8 * (ref.abs() + gamma * s)).all()

    eager = out.clone()
    out.fill_(float("nan"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch(x, *contract_args(a), out)        # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        launch(x, *contract_args(a), out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))


def _zoo_forcer(max_new_tokens: int):
    from specpilot import settings
    from specpilot.agents.forcing import engine_forcer

    pair = settings.zoo_pair()
    if pair is None:
        pytest.skip("zoo pair (code-tiny + drafter) not found: set SPECPILOT_ZOO")
    force = engine_forcer("cpu", n_prompts=1, max_new_tokens=max_new_tokens)
    assert force is not None
    return force, str(pair[0]), str(pair[1])


def test_engine_forcer_runs_the_real_token_forcing(temp_registry):
    # agents/forcing.py is `specpilot verify`'s verdict on the zoo pair (CPU, bf16 split12: the engine's
    # own kernels; nothing integrated, so nothing is dispatched). HumanEval prompt 0 has a bf16 near-tie
    # at token 6 (here: stock 2335, ours and the fp32 referee 2519, referee margin 0.07, excused below
    # 4 x noise 0.17): 24 tokens cross it, and the honest engine must pass.
    force, target_dir, drafter_dir = _zoo_forcer(24)
    outcome = force(target_dir, drafter_dir, {"cand_id": "none", "shape": [64, 96]})
    report = outcome.report
    assert outcome.passed and outcome.reason.startswith("token forcing passed"), outcome.reason
    assert report["prompts"] == 1 and report["tokens"] == 24 and report["referee"] == "fp32"
    assert report["mismatches"] == report["spec_mismatches"] == 0, outcome.reason
    assert report["variant_dispatched"] is False
    assert force(target_dir, None, {}).passed is False    # no drafter: stock cannot run


def test_engine_forcer_fails_a_mechanism_that_changes_outputs(temp_registry, monkeypatch):
    """The forcer is the verdict: an accept rule that takes every draft changes the speculative output,
    and the forcer refuses it (what the agents would integrate)."""
    from test_verify_planted import accept_all, host_control

    from specpilot.engine.replay import GreedyAcceptance

    host_control(monkeypatch)            # the host's control: the fault reaches the output
    monkeypatch.setattr(GreedyAcceptance, "accepted", accept_all)
    force, target_dir, drafter_dir = _zoo_forcer(12)
    outcome = force(target_dir, drafter_dir, {"cand_id": "none", "shape": [64, 96]})
    assert not outcome.passed and outcome.report["spec_mismatches"] > 0, outcome.reason
    assert "speculative output" in outcome.reason
