"""bench/suite.py: every task of every tier names an env seedbed makes, and a tiny-budget run of
the suite records what the docs' table needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from suite import TIERS, summarize, table  # noqa: E402

from seedbed.envs import check_env_id  # noqa: E402
from seedbed.resolve import resolve  # noqa: E402


def suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / "suite.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_every_task_is_an_env_with_a_threshold_and_a_budget(tier):
    for task in TIERS[tier]:
        if tier in ("classic", "atari"):  # the others need MuJoCo, which the dmc extra installs
            check_env_id(task.env)
            resolve([{"env": task.env}])  # the defaults a user gets resolve
        assert task.frames > 0 and task.reference
    assert any(task.tuned_on for task in TIERS[tier]) or tier == "mujoco"


def test_a_tiny_budget_run_records_each_seed_and_the_table(tmp_path):
    out = tmp_path / "suite.json"
    done = suite("--tier", "classic", "--tasks", "CartPole-v1", "--seeds", "0", "1",
                 "--frames", "6000", "--out", str(out), "--table", "--", "--no-energy")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert result["tier"] == "classic" and result["machine"]["cores"] >= 1
    (task,) = result["tasks"]
    assert task["env"] == "CartPole-v1" and task["tuned_on"] and task["reached"] == "0/2"
    assert [r["seed"] for r in task["runs"]] == [0, 1]
    assert all(r["frames"] >= 6000 and r["final_score"] > 0 for r in task["runs"])
    assert "| CartPole-v1 | 475 | 500,000 | 0/2 |" in done.stderr  # the table


def test_a_task_not_in_the_tier_is_refused():
    done = suite("--tier", "classic", "--tasks", "Pong")
    assert done.returncode == 2 and "not in tier classic: Pong" in done.stderr


def test_the_table_counts_seeds_that_reached_and_their_times():
    (task,) = [t for t in TIERS["classic"] if t.env == "Acrobot-v1"]
    keys = ("reached", "seconds_to_threshold", "frames_to_threshold", "final_score")
    rows = [(True, 10.0, 1000, -80.0), (True, 30.0, 3000, -90.0), (False, None, None, -400.0)]
    runs = [dict(zip(keys, row, strict=True)) for row in rows]
    row = summarize(task, runs)
    assert row["reached"] == "2/3" and row["median_seconds_to_threshold"] == 20.0
    assert row["worst_seconds_to_threshold"] is None  # a seed that never reached has no time
    assert row["median_final_score"] == -90.0
    assert "| Acrobot-v1 | -100 | 1,000,000 | 2/3 | 20 | - | 1,000, 3,000, - | -90 |" in table(
        [row]
    )
