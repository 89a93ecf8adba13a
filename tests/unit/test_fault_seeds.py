"""The fault tests' seeds (tests/fault_workload.fault_rng): fixed in `make test`, new ones when
DCMIRROR_FAULT_NEW_SEEDS is set (`make soak`), one replayed with DCMIRROR_FAULT_SEED; always
printed. The Makefile's FAULT_SCHEDULES (what `make soak` runs under new seeds) names every
test that calls fault_rng."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.fault_workload import fault_rng, fixed_fault_seed

ROOT = Path(__file__).resolve().parents[2]


def _draws(name: str) -> list[float]:
    rng = fault_rng(name)
    return [rng.random() for _ in range(5)]


def test_make_test_runs_a_fixed_seed_per_schedule(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DCMIRROR_FAULT_SEED", raising=False)
    monkeypatch.delenv("DCMIRROR_FAULT_NEW_SEEDS", raising=False)
    assert _draws("hard bounce") == _draws("hard bounce") != _draws("clean bounce")
    seed = fixed_fault_seed("hard bounce")
    assert 0 <= seed < 1 << 31
    assert f"hard bounce: fault seed {seed} (fixed; replay with DCMIRROR_FAULT_SEED={seed})" in capsys.readouterr().out


def test_soak_draws_new_seeds_and_prints_them(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DCMIRROR_FAULT_SEED", raising=False)
    monkeypatch.setenv("DCMIRROR_FAULT_NEW_SEEDS", "1")
    runs = [_draws("hard bounce") for _ in range(3)]
    assert len({tuple(r) for r in runs}) == 3
    seeds = [int(s) for s in re.findall(r"hard bounce: fault seed (\d+) \(new; replay with", capsys.readouterr().out)]
    assert len(seeds) == 3
    # A printed seed replays the run it drew.
    monkeypatch.setenv("DCMIRROR_FAULT_SEED", str(seeds[1]))
    assert _draws("hard bounce") == runs[1]
    assert "(replayed; replay with" in capsys.readouterr().out


def _fault_rng_calls() -> dict[str, list[ast.Call]]:
    """test id -> the fault_rng calls in it, for every test function that calls fault_rng."""
    found: dict[str, list[ast.Call]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        if "fault_rng(" not in text:
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                         and n.func.id == "fault_rng"]
                if calls:
                    found[f"{path.relative_to(ROOT)}::{node.name}"] = calls
    return found


def test_every_schedule_has_a_name_of_its_own() -> None:
    """Names given as plain strings differ (the fixed seed comes from the name)."""
    names = [c.args[0].value for calls in _fault_rng_calls().values() for c in calls
             if isinstance(c.args[0], ast.Constant)]
    assert len(names) >= 5 and len(names) == len(set(names)), names


def test_make_soak_runs_every_fault_schedule_under_new_seeds() -> None:
    makefile = (ROOT / "Makefile").read_text()
    block = re.search(r"^FAULT_SCHEDULES := \\\n((?:\t.*\n)+)", makefile, re.M)
    assert block, "no FAULT_SCHEDULES in the Makefile"
    listed = {line.strip().rstrip("\\").strip() for line in block.group(1).splitlines()}
    calling = set(_fault_rng_calls())
    assert calling and calling == listed, (f"calling fault_rng, not in FAULT_SCHEDULES: {sorted(calling - listed)}; "
                                           f"listed, not calling it: {sorted(listed - calling)}")
    assert "DCMIRROR_FAULT_NEW_SEEDS=1 $(PY) -m pytest -q -s $(FAULT_SCHEDULES)" in makefile
