"""Helpers shared by the agent tests (not a test module)."""
import json
from pathlib import Path

TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 128}


def tiny_target(folder: Path, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TINY, **overrides}))
    return folder


def tiny_drafter(folder: Path, block_size: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**TINY, "num_hidden_layers": 1, "block_size": block_size,
           "dflash_config": {"block_size": block_size, "target_layer_ids": [0, 1], "mask_token_id": 127}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def flat_time(candidate, shape) -> float:
    """A FakeTimer model under which every variant is equally fast (only noise differs)."""
    return 1e-5


class FakeForcer:
    """Stands in for the engine's token forcing; remembers what the registry held during each call.
    `variant_dispatched` is what the real forcer reports: whether the registry served the variant
    (forced to False with dispatched=False: forcing that ran some other kernel)."""

    def __init__(self, passed: bool = True, dispatched: bool = True):
        self.passed, self.dispatched, self.calls = passed, dispatched, []

    def __call__(self, target_dir, drafter_dir, variant):
        from specpilot.agents.forcing import ForcingOutcome
        from specpilot.kernels import registry

        held = json.loads(registry.variants_file().read_text())
        self.calls.append({"variant": variant, "registry": held})
        served = self.dispatched and any(v.get("cand_id") == variant["cand_id"] for v in held.values())
        return ForcingOutcome(self.passed, "fake forcing " + ("passed" if self.passed else "failed"),
                              {"prompts": 1, "mismatches": 0 if self.passed else 3, "variant_dispatched": served})
