import importlib.metadata
import json
import platform

from specpilot import __version__, _ext, settings


def configure(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object only")


def collect() -> dict:
    import torch

    info = {
        "specpilot": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if torch.cuda.is_available() else None,
    }
    for name in ("transformers", "dflash", "cupy-cuda13x", "triton", "safetensors", "openai"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = None
    try:
        info["build"] = _ext.build_info()
    except RuntimeError as e:
        info["build"] = {"error": str(e)}
    from specpilot.kernels import registry

    info["ops"] = registry.live_implementations()
    s = settings.get()
    info["zoo"] = str(s.zoo.resolve()) if settings.zoo_pair(s) else None
    info["embedded_pair"] = str(settings.EMBEDDED_PAIR) if (settings.EMBEDDED_PAIR / "target").is_dir() else None
    return info


def run(args) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info))
        return 0
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k:<24} {v}")
        else:
            print(f"{key:<26} {value}")
    return 0
