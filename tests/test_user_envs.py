"""Users' own environments, named ``module:EnvId`` (Gymnasium's convention) or by the plain id
their module registered, and the Python API: trained by local actors, remote ``seedbed actor``
processes and Ray actors, each of which imports the module. The env is the one
``examples/corridor.py`` defines, which takes no ``render_mode`` argument, as many users' envs
do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import seedbed
from seedbed.config import TrainConfig
from seedbed.envs import check_env_id, make_spec
from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from tests.conftest import finish
from tests.runtime.test_launch import launch, nothing_left_behind  # noqa: F401 - a fixture
from tests.runtime.test_remote_training import actor, learner, start

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CORRIDOR = "corridor:Corridor-v0"
# The plain id, as Gymnasium's docs register it: known wherever ``corridor`` was imported.
REGISTERED = ("--env", "Corridor-v0", "--plugins", "corridor")
SOLVED = ("--target-return", "0.9", "--total-frames", "1000000")


@pytest.fixture
def examples_on_path(monkeypatch):
    """The examples folder importable here and in every process started from here."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLES), path])))


def test_a_module_that_cannot_be_imported_is_one_line():
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'.*PYTHONPATH") as error:
        check_env_id("no_such_module:Corridor-v0")
    assert "\n" not in str(error.value)


def test_a_module_without_the_id_suggests_what_it_registered(examples_on_path):
    with pytest.raises(ConfigError, match="registered no such id.*did you mean Corridor-v0"):
        check_env_id("corridor:Coridor-v0")


def test_a_plain_id_a_users_module_registered_is_recorded_with_its_module(examples_on_path):
    import corridor  # noqa: F401 - registers Corridor-v0 here, as a user's script would

    assert resolve([{"env": "Corridor-v0"}]).train.env == CORRIDOR
    assert resolve([{"env": "CartPole-v1"}]).train.env == "CartPole-v1"  # Gymnasium's own


def python_api(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` as a user's ``__main__`` (its entry points live there)."""
    path = tmp_path / "user_script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("register", "says"),
    [
        ("gym.register('Mine-v0', entry_point=Mine)", "entry point actors cannot import"),
        ("gym.register('Mine-v0', entry_point=lambda: Mine())", "entry point actors cannot import"),
        (
            "gym.register('Mine-v0', entry_point='corridor:Corridor')",
            "importing 'corridor', its entry point's module, does not register it",
        ),
    ],
)
def test_an_id_registered_only_in_a_script_is_refused_before_any_actor(
    tmp_path, examples_on_path, register, says
):
    proc = python_api(
        tmp_path,
        f"""
        import gymnasium as gym
        import seedbed

        class Mine(gym.Env):
            pass

        if __name__ == "__main__":
            {register}
            seedbed.train(env="Mine-v0", total_frames=1000, progress=False)
        """,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("seedbed.errors.ConfigError: Mine-v0 is registered") and says in last
    assert "MODULE:Mine-v0" in last and "actor 0" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before the run began


@pytest.mark.slow
def test_the_python_api_trains_an_id_its_script_imported_a_module_for(tmp_path, examples_on_path):
    proc = python_api(
        tmp_path,
        """
        import corridor  # registers Corridor-v0, as Gymnasium's docs teach
        import seedbed

        if __name__ == "__main__":
            summary = seedbed.train(
                env="Corridor-v0", target_return=0.9, total_frames=1_000_000, progress=False
            )
            print(summary["env"], summary["stop_reason"])
        """,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == [CORRIDOR, "target_return"]


def test_the_spec_of_a_users_env(examples_on_path):
    spec = make_spec(CORRIDOR)
    assert spec.env_id == CORRIDOR and spec.obs_shape == (1,) and spec.num_actions == 2


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.slow
def test_local_actors_train_a_users_env_from_the_cli(tmp_path, no_leaks, examples_on_path):
    run = tmp_path / "run"
    proc = start("train", "--env", CORRIDOR, "--run-dir", str(run), "--no-progress", *SOLVED)
    code, _, err = finish(proc)
    assert code == 0, err[-2000:]
    assert summary_of(run)["stop_reason"] == "target_return"


@pytest.mark.slow
def test_a_remote_actor_imports_the_users_module(tmp_path, no_leaks, examples_on_path):
    run = tmp_path / "run"
    lr, address = learner(run, *REGISTERED, *SOLVED)
    actors = [actor(run, address) for _ in range(2)]
    code, _, err = finish(lr)
    assert code == 0, err[-2000:]
    assert summary_of(run)["stop_reason"] == "target_return"
    for one in actors:
        assert finish(one, 30)[0] == 0


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # beside the other Ray tests (test_launch.py)
def test_ray_actors_import_the_users_module(tmp_path, nothing_left_behind, examples_on_path):  # noqa: F811
    code, _, err = finish(launch(tmp_path / "run", *REGISTERED, *SOLVED))
    assert code == 0, err[-3000:]
    summary = summary_of(tmp_path / "run")
    assert summary["stop_reason"] == "target_return" and summary["env"] == CORRIDOR


@pytest.mark.slow
def test_the_example_script_trains_and_evaluates(tmp_path, no_leaks):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_corridor.py")],
        cwd=tmp_path,  # its run goes to ./runs
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("target_return after"), proc.stdout
    assert "evaluation: mean return" in proc.stdout
    assert list((tmp_path / "runs").glob("corridor_Corridor-v0-ppo-*/summary.json"))


def test_the_python_api_checks_settings_as_the_flags_are():
    with pytest.raises(ConfigError, match="--epochs and --minibatches must be >= 1"):
        seedbed.train(env="CartPole-v1", epochs=0)
    with pytest.raises(ConfigError, match="unknown setting 'totl_frames'"):
        seedbed.train(totl_frames=10)
    with pytest.raises(ConfigError, match="--episodes must be positive"):
        seedbed.evaluate("no-run", episodes=0)


@pytest.mark.slow
def test_the_python_api_trains_from_a_train_config_and_evaluates(tmp_path, no_leaks):
    base = TrainConfig(env="CartPole-v1", agent="vtrace", total_frames=4000, target_return=None)
    summary = seedbed.train(base, run_dir=str(tmp_path / "run"), progress=False, lr=1e-3)
    assert summary["agent"] == "vtrace" and summary["stop_reason"] == "total_frames"
    assert summary_of(tmp_path / "run")["frames"] == summary["frames"] >= 4000
    result = seedbed.evaluate(tmp_path / "run", episodes=2)
    assert result["env"] == "CartPole-v1" and len(result["returns"]) == 2


def test_a_video_of_an_env_without_render_mode_is_refused_in_one_line(examples_on_path):
    from seedbed.envs import make_env

    with pytest.raises(ConfigError, match="takes no render_mode argument"):
        make_env(CORRIDOR, render_mode="rgb_array")
