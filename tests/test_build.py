"""The build: the extension loads, `specpilot env` reports, every .cu compiles for sm_90a."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from specpilot import _ext, cli
from specpilot.settings import CSRC_DIR

CU_FILES = sorted((CSRC_DIR / "cuda").glob("*.cu"))


def test_extension_reports_build_info():
    info = _ext.build_info()
    assert set(info) >= {"with_cuda", "cxx"}


def test_env_prints_one_json_line(capsys):
    assert cli.main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["specpilot"] and info["torch"] and "ops" in info


def test_unknown_command_is_refused(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed on this machine")
@pytest.mark.parametrize("cu", CU_FILES, ids=[p.name for p in CU_FILES])
def test_cuda_source_compiles_for_sm90a(cu, tmp_path):
    # The same torch-free source must compile on a CPU-only machine (CI has nvcc, no GPU).
    cmd = ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I", str(CSRC_DIR / "include"),
           "-c", str(cu), "-o", str(tmp_path / (cu.stem + ".o"))]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
