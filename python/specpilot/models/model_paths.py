"""Model paths as users give them: a local folder, or a Hugging Face id ("ORG/NAME") found in the local
Hugging Face cache. Never the network: an id that is not in the cache is a clear error."""
from __future__ import annotations

import os
import re
from pathlib import Path

# An HF repo id: one "/" between two names of letters, digits, "-", "_", "."
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def hf_hub_cache() -> Path:
    """The hub cache folder, as huggingface_hub finds it: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub ($HF_HOME defaulting to $XDG_CACHE_HOME/huggingface)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):          # the older name, still honoured by the hub
        return Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The snapshot folder of `repo_id` in the cache (the one refs/main names; a lone snapshot when
    there is no refs/main), or None when the id is not there."""
    cache = hf_hub_cache() if cache is None else cache
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        folder = snapshots / commit
        if not folder.is_dir():
            raise FileNotFoundError(f"the Hugging Face cache entry of {repo_id!r} is broken: refs/main names "
                                    f"{commit}, which is not in {snapshots}")
        return folder
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(found) == 1:
        return found[0]
    if not found:
        return None
    raise ValueError(f"the Hugging Face cache holds {len(found)} snapshots of {repo_id!r} and no refs/main "
                     f"to choose one; pass the folder itself (one of {[str(p) for p in found]})")


def resolve_model_dir(spec, what: str = "model") -> str:
    """A local folder for `spec`: the folder itself when it exists, else the cached snapshot of the
    Hugging Face id it names. Errors say which path and which cache were searched."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ValueError(f"{what} {text!r} is a file; give the model's folder (config.json and weights)")
    if not HF_ID.match(text):
        raise FileNotFoundError(f"{what} folder {text!r} does not exist (and it is not a Hugging Face id "
                                "ORG/NAME either)")
    cache = hf_hub_cache()
    folder = cached_snapshot(text, cache)
    if folder is None:
        raise FileNotFoundError(
            f"{what} {text!r}: no such folder, and the Hugging Face id {text!r} is not in the local cache "
            f"{cache} (set HF_HUB_CACHE or HF_HOME to use another); specpilot never downloads: fetch it first, "
            f"e.g. `huggingface-cli download {text}`")
    return str(folder)
