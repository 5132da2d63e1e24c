"""Model paths as users give them: a folder, or a Hugging Face id resolved through the local HF cache
(HF_HUB_CACHE / HF_HOME / ~/.cache layout), never the network."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot import settings
from specpilot.cli import main
from specpilot.models.model_paths import cached_snapshot, hf_hub_cache, resolve_model_dir

ZOO = settings.zoo_pair()


def cache_entry(cache: Path, repo_id: str, folder: Path, commit: str = "0123abcd" * 5, ref: bool = True) -> Path:
    """The hub's layout: blobs/<sha> files, snapshots/<commit>/<name> symlinks to them, refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for f in sorted(Path(folder).iterdir()):
        if f.is_file():
            blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, blob)
            (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def clean_hf_env(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_cache_location_follows_the_hub_variables(clean_hf_env, tmp_path):
    assert hf_hub_cache() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    clean_hf_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    clean_hf_env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_hub_cache() == tmp_path / "hf" / "hub"
    clean_hf_env.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    assert hf_hub_cache() == tmp_path / "hubcache"


def test_a_folder_is_taken_as_is_and_a_file_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    assert resolve_model_dir(tmp_path / "m") == str(tmp_path / "m")
    (tmp_path / "f.bin").write_text("x")
    with pytest.raises(ValueError, match="is a file; give the model's folder"):
        resolve_model_dir(tmp_path / "f.bin")
    with pytest.raises(FileNotFoundError, match="does not exist .*not a Hugging Face id"):
        resolve_model_dir(str(tmp_path / "a" / "b" / "c"))


def test_an_id_resolves_to_its_snapshot_by_refs_main(clean_hf_env, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    clean_hf_env.setenv("HF_HOME", str(tmp_path / "hf"))
    snap = cache_entry(tmp_path / "hf" / "hub", "Org/model-1.5", src)
    cache_entry(tmp_path / "hf" / "hub", "Org/model-1.5", src, commit="f" * 40, ref=False)  # an older one
    assert resolve_model_dir("Org/model-1.5") == str(snap)
    assert json.loads((Path(resolve_model_dir("Org/model-1.5")) / "config.json").read_text()) == {}


def test_an_id_without_refs_main(clean_hf_env, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    cache = tmp_path / "c"
    clean_hf_env.setenv("HF_HUB_CACHE", str(cache))
    snap = cache_entry(cache, "o/one", src, ref=False)
    assert cached_snapshot("o/one", cache) == snap                 # a lone snapshot is the one
    cache_entry(cache, "o/one", src, commit="e" * 40, ref=False)
    with pytest.raises(ValueError, match="2 snapshots of 'o/one' and no refs/main"):
        resolve_model_dir("o/one")
    (cache / "models--o--one" / "refs").mkdir()
    (cache / "models--o--one" / "refs" / "main").write_text("d" * 40)
    with pytest.raises(FileNotFoundError, match="broken: refs/main names d{40}"):
        resolve_model_dir("o/one")


def test_an_id_not_in_the_cache_says_so_and_where_it_looked(clean_hf_env, tmp_path):
    clean_hf_env.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_dir("Qwen/Qwen3-8B", "--target")
    text = str(e.value)
    assert "'Qwen/Qwen3-8B' is not in the local cache" in text and str(tmp_path / "empty") in text
    assert "never downloads" in text and "huggingface-cli download Qwen/Qwen3-8B" in text


def test_generate_with_an_unknown_id_is_a_one_line_error(clean_hf_env, tmp_path, capsys):
    clean_hf_env.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    rc = main(["generate", "--target", "Org/missing", "--ar", "--prompt", "x", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("specpilot generate: error: --target 'Org/missing'") and err.count("\n") == 1


@pytest.mark.skipif(ZOO is None, reason="the zoo pair is not present ($SPECPILOT_ZOO)")
def test_zoo_pair_through_a_hub_cache_gives_the_same_tokens(clean_hf_env, tmp_path, capsys):
    """The zoo pair laid out as two cached Hub repos: generate by id == generate by folder."""
    target, drafter = ZOO
    cache = tmp_path / "hf" / "hub"
    cache_entry(cache, "zoo/code-tiny", target)
    cache_entry(cache, "zoo/code-tiny-dflash-b16", drafter, commit="9" * 40)
    clean_hf_env.setenv("HF_HOME", str(tmp_path / "hf"))
    common = ["--prompt", "def add(a, b):\n", "--max-new-tokens", "16", "--device", "cpu", "--dtype", "fp32"]
    assert main(["generate", "--target", "zoo/code-tiny", "--drafter", "zoo/code-tiny-dflash-b16", *common]) == 0
    by_id = capsys.readouterr().out
    assert main(["generate", "--target", str(target), "--drafter", str(drafter), *common]) == 0
    by_folder = capsys.readouterr().out
    text = lambda out: out.split("=== prompt ===\n")[1].split("\n--- prompt")[0]
    assert text(by_id) == text(by_folder) and len(text(by_id)) > 0
    assert json.loads(by_id.strip().splitlines()[-1])["tokens"] == 16

    from specpilot import load_pair

    t, d, tok = load_pair("zoo/code-tiny", "zoo/code-tiny-dflash-b16", device="cpu", dtype="fp32")
    assert t.source_dir == str(cache / "models--zoo--code-tiny" / "snapshots" / ("0123abcd" * 5))
    assert d.block_size == 16 and tok.eos_token_id == 8190
