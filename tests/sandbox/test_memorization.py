"""A published split is memorizable by design, and the grade says so:
`tests/sandbox/redteam/memorize.py` re-runs the engine on every published task to recognize its own
(everything it needs is in the sandbox, as anyone's copy of the package holds it) and beats the
finality gate on `public`; on a private split, which no policy carries, it gains nothing. The
report and the printed table call public grades development figures; a private split's report does
not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.sandbox.sandbox_harness import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
ATTACK = f"{Path(__file__).resolve().parent / 'redteam' / 'memorize.py'}:Memorize"
MASTER_SEED = 380043045761386235335514990255445123427  # drawn once by `python -m eval keygen`


def _headline(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval", "headline", "--policies",
                           f"{ATTACK},finality_gate", "--seeds", "1", "--out", str(out),
                           "--no-progress", *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def _gaps(out: Path) -> dict[str, float]:
    summary = json.loads((out / "summary.json").read_text())
    return {name: p["mean_gap"] for name, p in summary["policies"].items()}


def test_memorizing_beats_the_gate_on_public_and_gains_nothing_on_private(tmp_path):
    needs_sandbox()
    public = _headline(tmp_path / "public")
    assert public.returncode == 0, public.stderr
    gaps = _gaps(tmp_path / "public")
    assert gaps[ATTACK] < gaps["finality_gate"], gaps
    assert "A development figure" in public.stdout
    assert "A development figure" in (tmp_path / "public" / "report.md").read_text()

    seed = tmp_path / "master_seed"
    seed.write_text(f"{MASTER_SEED}\n")
    private = _headline(tmp_path / "private", "--split", "private", "--master-seed-file",
                        str(seed))
    assert private.returncode == 0, private.stderr
    gaps = _gaps(tmp_path / "private")
    assert gaps[ATTACK] >= gaps["finality_gate"], gaps
    assert "A development figure" not in private.stdout
    assert "A development figure" not in (tmp_path / "private" / "report.md").read_text()
