"""The learning rate over a run: the schedule's arithmetic, its optimizers and a real run."""

from __future__ import annotations

import csv

import pytest
import torch

from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import load_checkpoint
from seedbed.runtime.lr_schedule import LearningRates, lr_fraction
from seedbed.runtime.train import train
from tests.conftest import tiny_settings


def test_linear_falls_to_zero_at_the_total_and_stays_there():
    assert lr_fraction("linear", 0, 1000) == 1.0
    assert lr_fraction("linear", 250, 1000) == pytest.approx(0.75)
    assert lr_fraction("linear", 1000, 1000) == 0.0
    assert lr_fraction("linear", 1500, 1000) == 0.0  # the last batch may pass the total
    assert lr_fraction("constant", 900, 1000) == 1.0


def test_a_held_rate_stays_then_falls_to_zero_at_the_total():
    assert lr_fraction("linear", 0, 1000, hold_frames=600) == 1.0
    assert lr_fraction("linear", 600, 1000, hold_frames=600) == 1.0
    assert lr_fraction("linear", 700, 1000, hold_frames=600) == pytest.approx(0.75)
    assert lr_fraction("linear", 1000, 1000, hold_frames=600) == 0.0


def test_a_run_that_ends_within_its_hold_keeps_its_rate(tmp_path):
    # Atari's PPO holds 6 M frames: a shorter run is valid and learns at the constant rate.
    assert resolve([{"env": "atari:Pong"}]).train.lr_hold_frames == 6_000_000
    settings = tiny_settings(tmp_path / "run", total_frames=6000, lr_schedule="linear")
    config = resolve([{**settings, "lr_hold_frames": 6000}])
    assert config.train.lr_hold_frames == 6000
    assert [lr_fraction("linear", f, 6000, 6000) for f in (0, 3000, 6000)] == [1.0, 1.0, 1.0]


def test_every_group_of_every_optimizer_is_scaled_from_its_own_initial_rate():
    actor, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    first = torch.optim.Adam(actor.parameters(), lr=1e-3)
    second = torch.optim.SGD(
        [{"params": critic.weight, "lr": 0.1}, {"params": critic.bias, "lr": 0.5}]
    )
    rates = LearningRates([first, second], "linear", 100)
    assert rates.update(40) == pytest.approx(0.6)
    lrs = [g["lr"] for opt in (first, second) for g in opt.param_groups]
    assert lrs == pytest.approx([6e-4, 0.06, 0.3])
    # A resumed run's optimizer comes back with its initial rates, not the decayed ones.
    saved = second.state_dict()
    fresh = torch.optim.SGD(
        [{"params": critic.weight, "lr": 0.1}, {"params": critic.bias, "lr": 0.5}]
    )
    fresh.load_state_dict(saved)
    LearningRates([fresh], "linear", 100).update(90)
    assert [g["lr"] for g in fresh.param_groups] == pytest.approx([0.01, 0.05])


def test_a_constant_schedule_leaves_the_rates_alone():
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    LearningRates([opt], "constant", 100).update(99)
    assert opt.param_groups[0]["lr"] == 1e-3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lr_schedule": "cosine"}, "lr-schedule"),
        ({"lr_hold_frames": 100}, "add --lr-schedule linear"),
        ({"lr_schedule": "linear", "lr_hold_frames": -1}, "must be >= 0"),
    ],
)
def test_bad_schedule_settings_are_refused_with_one_line(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve([tiny_settings(tmp_path / "run", total_frames=6000, **settings)])


def test_a_linear_run_logs_its_held_then_falling_rate_and_checkpoints_it(tmp_path, no_leaks):
    run = tmp_path / "run"
    settings = tiny_settings(run, total_frames=6000, lr_schedule="linear", lr_hold_frames=1000)
    summary = train(resolve([settings]))
    with open(run / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["lr_fraction"]]
    fractions = [float(r["lr_fraction"]) for r in rows]
    assert fractions == sorted(fractions, reverse=True), fractions
    assert fractions[0] > 0.5 and fractions[-1] < 0.5
    for row in rows:  # each row's rate was set from frames before that row's
        falling = max(0, int(row["frames"]) - 1000)
        assert float(row["lr_fraction"]) >= 1 - falling / 5000 - 1e-9
    state = load_checkpoint(summary["checkpoint"])["agent"]["optimizer"]
    group = state["param_groups"][0]
    lr = resolve([tiny_settings(run)]).agent.lr
    assert group["initial_lr"] == lr
    assert group["lr"] <= lr * fractions[-1] + 1e-12  # the rate only falls
