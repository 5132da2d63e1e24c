"""`specpilot demo` for a new user: with no zoo it runs the small trained pair shipped in the package
(real completions, real acceptance, a real verdict) and says where it looked; a wrong SPECPILOT_ZOO is
an error; piped output has no ANSI codes; nothing is left in the temporary folder."""
import json
import re
import tempfile
from pathlib import Path

import pytest

from test_engine_helpers import one_cpu_thread  # noqa: F401  (autouse: one CPU thread)
from specpilot import settings
from specpilot.cli import main


def test_the_embedded_pair_is_in_the_package_and_small():
    target, drafter = settings.embedded_pair()
    assert target.parent == drafter.parent == settings.EMBEDDED_PAIR
    files = [p for p in settings.EMBEDDED_PAIR.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert size < 8 * 2**20, f"the embedded pair is {size / 2**20:.1f} MiB"
    for folder in (target, drafter):
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
        assert (folder / "model.safetensors").stat().st_size > 100_000
    held_out = json.loads((settings.EMBEDDED_PAIR / "train_stats.json").read_text())["heldout"]
    # measured by scripts/embedded_pair/measure.py: drafts accepted (a random drafter gives 1.00), lossless
    assert held_out["prompts"] == held_out["prompts_with_steps"] == held_out["identical_to_ar"] == 50
    assert held_out["tau"] > 1.15


def test_demo_without_a_zoo_runs_the_embedded_pair(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("SPECPILOT_ZOO", raising=False)
    monkeypatch.chdir(tmp_path)                               # the default ../shared/zoo is not there
    before = set(Path(tempfile.gettempdir()).iterdir())
    rc = main(["demo", "--prompts", "2", "--max-new-tokens", "32", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    first = out.splitlines()[0]
    assert f"no zoo pair at {(tmp_path.parent / 'shared' / 'zoo').resolve()}" in first
    assert f"shipped with specpilot, {settings.EMBEDDED_PAIR}" in first
    taus = [float(t) for t in re.findall(r"acceptance length \(tau\) ([0-9.]+)", out)]
    assert len(taus) == 2 and min(taus) > 1.0                    # a trained drafter: drafts accepted
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["passed"] is True and summary["prompts"] == 2 and summary["tokens"] >= 2
    assert "\033[" not in out                                    # piped: no ANSI codes
    left = {p.name for p in set(Path(tempfile.gettempdir()).iterdir()) - before}
    assert not [n for n in left if n.startswith("specpilot")], left


def test_a_wrong_specpilot_zoo_is_an_error_not_a_fallback(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPECPILOT_ZOO", str(tmp_path / "no-zoo"))
    rc = main(["demo", "--prompts", "1", "--max-new-tokens", "4", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"SPECPILOT_ZOO={tmp_path / 'no-zoo'}: no zoo pair there" in err and "unset SPECPILOT_ZOO" in err


@pytest.mark.skipif(settings.zoo_pair() is None, reason="the zoo pair is not present ($SPECPILOT_ZOO)")
def test_the_zoo_pair_is_preferred_when_present(monkeypatch, capsys):
    from specpilot.commands.demo import pair_and_prompts

    (target, drafter), prompts, note = pair_and_prompts(2)
    assert (target, drafter) == settings.zoo_pair() and len(prompts) == 2 and note.startswith("the zoo pair at ")


def test_setup_ships_every_file_of_the_embedded_pair():
    """setup.py's package_data globs cover the whole folder (a wheel without the weights would break demo)."""
    import fnmatch
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("specpilot_setup", root / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    patterns = setup.PACKAGE_DATA["specpilot"]
    package = root / "python" / "specpilot"
    files = [p.relative_to(package).as_posix() for p in settings.EMBEDDED_PAIR.rglob("*") if p.is_file()]
    assert len(files) >= 10
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []
