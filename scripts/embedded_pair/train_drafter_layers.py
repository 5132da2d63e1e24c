"""The zoo recipe's train_drafter.py with the target layers it reads given explicitly (--layer-ids).
dflash's build_target_layer_ids spreads them over layers 1 .. n-3, which for a 4-layer target gives
[1, 1, 1]; the embedded target has 4 layers, so its drafter reads layers 1, 2 and 3 instead.

  python train_drafter_layers.py --layer-ids 1,2,3 [--init DRAFTER_DIR] <train_drafter.py arguments>

--init starts from a drafter saved by an earlier run (a CPU budget split over two runs).
"""
import argparse
import os
import sys

ZOO_RECIPE = os.environ.get("SPECPILOT_ZOO_RECIPE", os.path.join(os.path.dirname(__file__), "../../../shared/zoo/recipe"))
sys.path.insert(0, os.path.abspath(ZOO_RECIPE))
import train_drafter  # noqa: E402  (the zoo recipe)


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--layer-ids", required=True, help="comma list of target layer indices")
    ap.add_argument("--init", help="a drafter folder to continue training from")
    known, rest = ap.parse_known_args()
    ids = [int(x) for x in known.layer_ids.split(",")]
    train_drafter.build_target_layer_ids = lambda n_layers, n_ctx: ids
    if known.init:
        from safetensors.torch import load_file

        base = train_drafter.DFlashDraftModel

        class Continued(base):
            def __init__(self, config):
                super().__init__(config)
                self.load_state_dict(load_file(f"{known.init}/model.safetensors"), strict=True)
                print(f"[drafter] weights from {known.init}", flush=True)

        Continued.__name__ = Continued.__qualname__ = base.__name__      # config.json's architectures
        train_drafter.DFlashDraftModel = Continued
    sys.argv = [sys.argv[0], "--ctx-layers", str(len(ids))] + rest
    train_drafter.main()


if __name__ == "__main__":
    main()
