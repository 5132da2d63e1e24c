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


def _setup_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("specpilot_setup", CSRC_DIR.parent / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() does not run
    return module


def test_build_refuses_cuda_torch_without_nvcc():
    setup = _setup_module()
    with pytest.raises(SystemExit, match="nvcc was not found.*SPECPILOT_CUDA=0"):
        setup.check_cuda_toolchain("2.11.0", "13.0", None, "90a", (9, 0), "NVIDIA H200")


def test_build_refuses_unsupported_gpu_and_arch(tmp_path):
    setup = _setup_module()
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("")
    with pytest.raises(SystemExit, match="sm_80.*need sm_90"):
        setup.check_cuda_toolchain("2.11.0", "13.0", str(nvcc), "90a", (8, 0), "NVIDIA A100")
    with pytest.raises(SystemExit, match="SPECPILOT_CUDA_ARCH=86 is not supported"):
        setup.check_cuda_toolchain("2.11.0", "13.0", str(nvcc), "86", None, None)
    setup.check_cuda_toolchain("2.11.0", "13.0", str(nvcc), "90a", (9, 0), "NVIDIA H200")  # accepted


def test_build_mode_switch():
    setup = _setup_module()
    assert setup.want_cuda("2.13.0+cpu", None, "auto") is False
    assert setup.want_cuda("2.11.0", "13.0", "auto") is True
    assert setup.want_cuda("2.11.0", "13.0", "0") is False
    with pytest.raises(SystemExit, match="no CUDA support"):
        setup.want_cuda("2.13.0+cpu", None, "1")
    with pytest.raises(SystemExit, match="must be auto, 0 or 1"):
        setup.want_cuda("2.11.0", "13.0", "yes")


def test_cxx_standard_follows_torch():
    """torch 2.14's headers refuse anything before C++20 (found building against torch 2.14.1)."""
    setup = _setup_module()
    assert setup.cxx_standard("2.11.0+cu130") == "-std=c++17"
    assert setup.cxx_standard("2.13.0+cpu") == "-std=c++17"
    assert setup.cxx_standard("2.14.1+cu130") == "-std=c++20"
    assert setup.cxx_standard("3.0.0") == "-std=c++20"


def test_env_prints_a_table_or_json_never_both(capsys):
    from specpilot import cli

    assert cli.main(["env"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("specpilot ") and "{" not in table
    assert cli.main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["specpilot"]


def test_memory_show_on_a_fresh_install_is_no_error(tmp_path, capsys):
    from specpilot import cli

    path = tmp_path / "none.sqlite"
    assert cli.main(["memory", "show", "--memory", str(path)]) == 0
    assert "no agent memory yet" in capsys.readouterr().out and not path.exists()
