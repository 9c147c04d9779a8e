"""bench/wire.py: both wires serve a real stream on 127.0.0.1 and the report holds their costs."""

from __future__ import annotations

from tests.conftest import bench_report


def test_wire_bench_reports_each_wires_server_cpu(tmp_path):
    args = ["--sizes", "765,56560", "--steps", "200", "--warmup", "20"]
    report = bench_report("wire.py", args, tmp_path / "wire.json")
    assert report["machine"]["cores"] >= 1
    points = report["points"]
    assert [(p["wire"], p["bytes_per_step"]) for p in points] == [
        ("grpc_aio", 765),
        ("socket", 765),
        ("grpc_aio", 56560),
        ("socket", 56560),
    ]
    for point in points:
        assert point["steps"] == 200
        assert 0 < point["server_cpu_us_per_round_trip"] < 1e5
        assert 0 < point["wall_us_per_round_trip"] < 1e6
