"""Settings: defaults, YAML and flags in that order; typed values; clear errors."""

from __future__ import annotations

import pytest
import yaml

from seedbed.config import TrainConfig, load_yaml
from seedbed.errors import ConfigError
from seedbed.resolve import resolve


def test_defaults_are_the_embedded_cartpole_run():
    config = resolve([{}])
    assert config.train.env == "CartPole-v1" and config.train.agent == "ppo"
    assert config.train.target_return == 475.0
    assert config.agent.normalize_obs and config.agent.popart and config.train.unroll == 128
    assert (config.agent.epochs, config.agent.lr) == (4, 2e-3)
    assert resolve([{"env": "atari:Pong"}]).train.agent == "ppo"
    assert resolve([{"env": "dmc:cartpole-balance"}]).train.agent == "ppo"  # continuous actions
    assert resolve([{"env": "HalfCheetah-v5"}]).train.agent == "ppo"
    vtrace = resolve([{"agent": "vtrace"}])  # chosen, it keeps its own settings
    assert vtrace.agent.lr == 1.4e-3 and not vtrace.agent.normalize_obs


def test_later_layers_win_and_agent_settings_nest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"actors": 3, "lr": 0.1, "ppo": {"discount": 0.9}}))
    config = resolve([load_yaml(path), {"lr": "0.5", "lstm": True}])
    assert config.train.actors == 3
    assert config.agent.lr == 0.5 and config.agent.discount == 0.9 and config.agent.lstm


def test_replicas_share_the_actors_batch_and_queue():
    train = resolve([{"learner_replicas": 2, "actors": 4, "batch": 32, "queue_size": 33}]).train
    shards = [train.replica_shard(r) for r in range(2)]
    assert [(s.actors, s.batch, s.queue_size) for s in shards] == [(2, 16, 17)] * 2
    assert shards[0].seed != shards[1].seed  # different episodes on each replica
    assert train.replica_shard(0).total_frames == train.total_frames  # budgets stay global


@pytest.mark.parametrize(
    ("listen", "others"),
    [
        ("0.0.0.0:7000", ["0.0.0.0:0", "0.0.0.0:0"]),
        ("[::1]:7000", ["[::1]:0", "[::1]:0"]),
        ("unix:/tmp/l.sock", ["unix:/tmp/l.sock.replica-1", "unix:/tmp/l.sock.replica-2"]),
    ],
)
def test_replicas_split_the_remote_slots_and_listen_beside_the_front_door(listen, others):
    layer = {"learner_replicas": 3, "actors": 0, "batch": 12, "listen": listen, "remote_actors": 7}
    train = resolve([layer]).train
    shards = [train.replica_shard(r) for r in range(3)]
    assert [s.remote_actors for s in shards] == [3, 2, 2]  # as many as asked, in all
    assert [s.listen for s in shards] == [listen, *others]  # replica 0 is the front door


def test_each_replica_runs_its_own_gateway_processes():
    layer = {"learner_replicas": 2, "listen": "127.0.0.1:7000", "gateways": 3}
    train = resolve([layer]).train
    assert [train.replica_shard(r).gateways for r in range(2)] == [3, 3]


def test_saved_config_round_trips():
    config = resolve([{"hidden_sizes": "32,16", "target_return": "none"}])
    again = resolve([config.to_dict()])
    assert again == config
    assert again.agent.hidden_sizes == (32, 16) and again.train.target_return is None


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"actors": 0}, "--actors must be positive"),
        ({"envs_per_actor": -2}, "--envs-per-actor must be positive"),
        ({"batch": 64, "queue_size": 8}, "--queue-size (8) must be >= --batch (64)"),
        ({"lr": "fast"}, "--lr: invalid value 'fast'"),
        ({"actros": 2}, "unknown setting 'actros'; did you mean actors?"),
        ({"device": "tpu"}, "--device: invalid value 'tpu'"),
        ({"agent": "a3c"}, "unknown agent 'a3c'"),
        ({"resume": True}, "--resume needs --run-dir"),
        ({"country": "xx"}, "--country must be a 3-letter ISO code like USA or FRA, got 'xx'"),
        (
            {"agent": "dqn", "replay_capacity": 1000, "min_replay": 5000},
            "--replay-capacity (1000) is below --min-replay (5000)",
        ),
        (
            {"agent": "dqn", "replay_capacity": 100, "min_replay": 100},
            "holds 98 items in whole unrolls of 14",  # unroll 16, n-step 3
        ),
        ({"target_episodes": 0}, "--target-episodes must be between 1 and 100"),
        ({"broadcast_every": 0}, "--broadcast-every must be positive, got 0"),
        ({"actor_precision": "int8"}, "--actor-precision is for --inference local"),
        ({"inference": "local", "precision": "int8"}, "--precision is for --inference central"),
        ({"precision": "int8", "device": "cuda"}, "--precision int8 uses PyTorch's int8 CPU"),
        ({"precision": "int4"}, "--precision"),
        ({"learner_replicas": 0}, "--learner-replicas must be positive, got 0"),
        ({"learner_threads": -1}, "--learner-threads must be >= 0, got -1"),
        ({"gateways": 0}, "--gateways must be at least 1, got 0"),
        (
            {"listen": "unix:/tmp/l.sock", "gateways": 2},
            "--gateways 2 shares a TCP port among processes; a Unix socket cannot be shared",
        ),
        ({"transport": "grpc"}, "--transport grpc: unknown; choose one of shm"),
        ({"transport": "inprocess"}, "--transport inprocess reaches only threads"),
        (
            {"learner_replicas": 2, "actors": 3},
            "--actors 3 does not split evenly over --learner-replicas 2",
        ),
        (
            {"learner_replicas": 2, "batch": 33, "queue_size": 64},
            "--batch 33 does not split evenly over --learner-replicas 2",
        ),
        (
            {"learner_replicas": 2, "listen": "127.0.0.1:0", "remote_actors": 1},
            "--remote-actors 1 is fewer than --learner-replicas 2: each replica serves remote "
            "actors; give at least 2",
        ),
        ({"agent": "dqn", "unroll": 2}, "--unroll (2) must be >= --n-step (3)"),
        ({"agent": "dqn", "replay_ratio": 0}, "--replay-ratio must be positive or none"),
        ({"agent": "r2d2", "burn_in": 16}, "--burn-in (16) must be shorter than"),
        ({"agent": "r2d2", "sequence_overlap": 16}, "--sequence-overlap (16) must be >= 0"),
        ({"agent": "r2d2", "priority_eta": 2}, "--priority-eta and --epsilon-base must lie"),
    ],
)
def test_bad_settings_give_one_line_errors(layer, message):
    with pytest.raises(ConfigError) as info:
        resolve([layer])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- a\n- list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_yaml(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")


def test_num_envs():
    assert TrainConfig(actors=3, envs_per_actor=5).num_envs == 15


def test_atari_ids_get_their_family_defaults_below_files_and_flags(tmp_path):
    atari = resolve([{"env": "atari:Pong"}])
    assert atari.train.target_return is None and atari.train.unroll == 64
    assert atari.train.batch == atari.train.num_envs == 16
    assert atari.agent.normalize_obs and atari.agent.popart and atari.agent.lr == 2.5e-4
    assert atari.agent.torso == "a3c" and atari.agent.shared_torso
    assert atari.train.lr_schedule == "linear" and atari.train.total_frames == 20_000_000
    assert atari.agent.discount == 0.99 and atari.agent.reward_clip == 1.0
    vtrace = resolve([{"env": "atari:Pong", "agent": "vtrace"}])  # V-trace's own, A2C's layout
    assert vtrace.train.unroll == 5 and not vtrace.agent.normalize_advantages
    assert vtrace.agent.torso == "nature" and vtrace.train.lr_schedule == "constant"
    classic = resolve([{"env": "Acrobot-v1"}])
    assert classic.agent.torso == "mlp" and classic.train.unroll == 128
    path = tmp_path / "c.yaml"
    path.write_text("env: atari:Pong\nunroll: 40\nppo:\n  torso: impala\n")
    mine = resolve([load_yaml(path), {"discount": 0.9}])
    assert mine.train.unroll == 40 and mine.agent.torso == "impala"
    assert mine.agent.discount == 0.9 and mine.agent.reward_clip == 1.0
