"""bench/time_to_score.py: the ladder, the ratios and the reading of Sample Factory's log."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from time_to_score import Curve, SampleFactoryLog, ladder, ratios  # noqa: E402


def test_ladder_takes_the_first_point_at_or_above_each_rung():
    curve = Curve([10.0, 20.0, 30.0, 40.0], [100, 200, 300, 400], [-21.0, -20.0, -16.0, -14.5])
    assert ladder(curve, [-20.0, -15.0, 0.0]) == [
        {"rung": -20.0, "seconds_from_command_start": 20.0, "frames": 200},
        {"rung": -15.0, "seconds_from_command_start": 40.0, "frames": 400},
        {"rung": 0.0, "seconds_from_command_start": None, "frames": None},
    ]


def test_within_drops_points_past_the_budget_and_without_a_mean():
    curve = Curve([5.0, 10.0, 20.0], [1, 2, 3], [math.nan, -20.0, 5.0]).within(15.0)
    assert (curve.seconds, curve.frames, curve.returns) == ([10.0], [2.0], [-20.0])
    assert Curve().final() is None


def test_ratios_only_where_both_reached():
    ours = ladder(Curve([30.0, 60.0], [1, 2], [-20.0, -15.0]), [-20.0, -15.0, -10.0])
    peer = ladder(Curve([60.0], [1], [-20.0]), [-20.0, -15.0, -10.0])
    assert ratios(ours, peer) == [{"rung": -20.0, "seedbed_seconds_over_peer_seconds": 0.5}]


def test_sample_factory_log_pairs_each_mean_with_the_frames_printed_before_it():
    log = SampleFactoryLog()
    lines = [
        "\x1b[36m[2026-12-02 03:53:29,749][28696] Fps is (10 sec: 819.2). Total num frames: "
        "24576. Throughput: 0: 128.0.\x1b[0m",
        "\x1b[36m[2026-12-02 03:53:29,750][28696] Avg episode reward: [(0, '-20.857')]\x1b[0m",
        "[2026-12-02 03:53:34,749][28696] Avg episode reward: []",
        "[2026-12-02 03:53:39,749][28696] Fps is (...). Total num frames: 28672. Throughput",
        "[2026-12-02 03:53:39,750][28696] Avg episode reward: [(0, '-20.625')]",
        "[2026-12-02 03:53:41,259][28696] Collected {0: 30720}, FPS: 693.1",
    ]
    for t, line in zip([101.0, 101.0, 106.0, 111.0, 111.5, 113.0], lines, strict=True):
        log.feed(t, line)
    curve = log.curve(start=100.0)
    assert (curve.seconds, curve.frames, curve.returns) == (
        [1.0, 11.5],
        [24576, 28672],
        [-20.857, -20.625],
    )
    assert log.frames == 30720


def test_full_window_ladder_ignores_means_of_the_first_few_episodes():
    # A lucky first game reads -19 on the plain ladder; the full window waits for 100 games.
    curve = Curve([5.0, 60.0, 90.0], [1, 2, 3], [-19.0, -20.5, -19.5], [1, 99, 100])
    assert ladder(curve, [-20.0])[0]["seconds_from_command_start"] == 5.0
    assert ladder(curve.full_window(), [-20.0])[0]["seconds_from_command_start"] == 90.0
    assert curve.within(70.0).full_window().returns == []


def test_full_window_needs_the_episode_counts():
    with pytest.raises(ValueError, match="episodes"):
        Curve([1.0], [1], [-20.0]).full_window()
