"""The README's Python example, run as written on the pair shipped in the package (CPU, fp32): greedy
speculative decoding gives the target's own tokens, the drafter accepts, and what it prints is what the
results hold."""
import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_one_python_example_and_the_two_first_commands():
    text = README.read_text()
    assert len(python_blocks(text)) == 1
    assert "bash scripts/install.sh" in text and "python -m specpilot demo" in text


def test_readme_example_runs_and_is_lossless(tmp_path, monkeypatch):
    import torch

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)                     # no zoo, no files: the example needs neither
    code = python_blocks(README.read_text())[0]
    namespace, printed = {"__name__": "readme_example"}, io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), namespace)
    ar, spec = namespace["ar"], namespace["spec"]
    assert len(ar.tokens) == 32 and spec.tokens == ar.tokens
    assert spec.steps == len(spec.acceptance_lengths) >= 1
    assert all(1 <= a <= 16 for a in spec.acceptance_lengths)
    assert spec.tau > 1.0                           # a trained drafter: some drafts accepted
    assert printed.getvalue() == (f"32 tokens in {spec.steps} verify steps, tau {spec.tau:.2f}\n"
                                  f"{namespace['tokenizer'].decode(spec.tokens)}\n")


def _gen_config_table():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_config_table", README.parent / "docs" / "gen_config_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_table_has_one_row_per_field_with_type_default_and_doc():
    import dataclasses
    import typing

    gen = _gen_config_table()

    @dataclasses.dataclass(frozen=True)
    class Config:
        cuda_graphs: bool = True
        """capture each step
        in a CUDA graph"""
        attention: typing.Literal["auto", "sdpa"] = "auto"
        splits: tuple = dataclasses.field(default_factory=tuple)
        """key splits | per call"""

    assert gen.config_table(Config).splitlines() == [
        "| field | type | default | what it chooses |", "|---|---|---|---|",
        "| `cuda_graphs` | `bool` | `True` | capture each step in a CUDA graph |",
        "| `attention` | `Literal['auto', 'sdpa']` | `'auto'` |  |",
        "| `splits` | `tuple` | `()` | key splits / per call |"]
    with pytest.raises(TypeError, match="is not a dataclass"):
        gen.config_table(int)


def test_config_table_goes_between_the_readme_markers():
    gen = _gen_config_table()
    text = README.read_text()
    new = gen.replace_table(text, "| a | b |")
    assert f"{gen.START}\n| a | b |\n{gen.END}" in new
    assert new.replace("| a | b |", "X") == gen.replace_table(text, "X")   # only the table changed
    with pytest.raises(ValueError, match="exactly one"):
        gen.replace_table("no markers", "| a |")


def test_readme_config_table_is_the_generated_one():
    """The README's configuration table is what docs/gen_config_table.py generates from EngineConfig."""
    from specpilot import config

    gen = _gen_config_table()
    text = README.read_text()
    assert gen.replace_table(text, gen.config_table(config.EngineConfig)) == text


def test_public_api_names_load_lazily():
    import subprocess
    import sys

    import specpilot

    assert set(specpilot.__all__) == {"Engine", "EngineConfig", "embedded_pair", "load_pair", "__version__"}
    from specpilot.engine import Engine

    assert specpilot.Engine is Engine and callable(specpilot.load_pair)
    with pytest.raises(AttributeError, match="has no attribute 'Engin'"):
        specpilot.Engin
    # `import specpilot` alone does not import torch (the names load on first use)
    code = "import sys, specpilot; print(specpilot.__version__, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [specpilot.__version__, "False"]


def test_readme_config_tables_are_current():
    """README.md's EngineConfig and BatchConfig tables are the ones the dataclasses' docstrings give
    (a changed field doc without `python docs/gen_config_table.py --write` fails here)."""
    assert _gen_config_table().main(["--check"]) == 0
