"""The demo names a step's limit when a step runs past it (issue 41: it said "dcmirror load
exited -9")."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.demo import DemoFailed, run_dcmirror


def test_a_step_past_its_limit_is_named_with_the_limit(tmp_path: Path) -> None:
    with pytest.raises(DemoFailed, match=r"`dcmirror topology` did not finish within 0\.01 s, the demo's limit for "
                                         r"this step \(stopped\)"):
        run_dcmirror(["topology", "--help"], tmp_path, 0.01, echo=False)
    code, output, _ = run_dcmirror(["topology", "--help"], tmp_path, 60, echo=False)
    assert code == 0 and "check" in output
