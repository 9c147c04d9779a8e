"""bench/step_parts.py: each of seedbed's own parts of a remote step is timed, per E."""

from __future__ import annotations

from tests.conftest import bench_report


def test_step_parts_bench_reports_every_part_for_every_envs(tmp_path):
    args = ["--envs", "2,4", "--actors", "2", "--repeats", "1"]
    report = bench_report("step_parts.py", args, tmp_path / "parts.json")
    assert report["benchmark"] == "step_parts" and report["machine"]["cores"] >= 1
    assert [p["envs"] for p in report["points"]] == [2, 4]
    for point in report["points"]:
        for part in ("decode_us", "check_us", "server_step_us_per_frame", "acting_us_per_frame"):
            assert 0 < point[part] < 1e5, (part, point)
        assert point["acting_us_per_frame"] < point["server_step_us_per_frame"]
