"""bench/gpu.sh: a check set it does not know is refused in one line, before it touches anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu.sh"


def test_unknown_check_set_is_refused_before_any_work(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out), "pongg"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "bench/gpu.sh: unknown check set 'pongg'; use checks or pong"
    ]
    assert not out.exists()
