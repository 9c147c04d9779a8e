"""Tests for seedbed.loggers: the registry, RunLogger's composition of sinks, and the real
TensorBoard and W&B sinks. W&B runs offline and what it wrote is read back from its .wandb file."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

import seedbed.loggers
from seedbed.config import RunConfig, TrainConfig
from seedbed.errors import ConfigError, SeedbedError
from seedbed.loggers import DEFAULT_LOGGERS, LOGGERS, RunInfo, RunLogger
from seedbed.loggers.wandb import ID_FILE
from seedbed.resolve import resolve
from seedbed.runtime.rundir import sinks
from seedbed.telemetry import read_metrics
from tests.conftest import assert_imports_without, tiny_settings

# A toy sink, registered from the tests, as a user's own would be.


class ListSink:
    """Keeps every row it is given; says what it was told of the run."""

    made: list[ListSink] = []

    def __init__(self, run: RunInfo) -> None:
        self.run = run
        self.rows: list[dict[str, Any]] = []
        self.closed = False
        ListSink.made.append(self)

    def write(self, row) -> None:
        self.rows.append(dict(row))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def toy(monkeypatch):
    ListSink.made = []
    monkeypatch.setitem(LOGGERS, "toy", ListSink)
    return ListSink


def test_registered_sink_receives_rows_through_run_logger(tmp_path, toy):
    rows = [{"frames": 100, "wall_s": 1.0, "loss": None}, {"frames": 200, "wall_s": 2.0}]
    with RunLogger(
        tmp_path, total_frames=500, resume_frames=50, progress=False, loggers=("csv", "toy")
    ) as log:
        for row in rows:
            log.log(row)
        (sink,) = toy.made
        assert log.sinks == {"csv": log.sinks["csv"], "toy": sink}
        assert not sink.closed
    assert sink.rows == rows
    assert sink.closed
    assert (sink.run.run_dir, sink.run.total_frames, sink.run.resume_frames) == (tmp_path, 500, 50)
    assert list(read_metrics(tmp_path)["frames"]) == [100, 200]  # the other sink got them too


def test_rows_are_checked_before_any_sink_sees_them(tmp_path, toy):
    log = RunLogger(tmp_path, total_frames=None, loggers=("toy",))
    with pytest.raises(KeyError, match="frames"):
        log.log({"wall_s": 1.0})
    log.close()
    assert toy.made[0].rows == []
    with pytest.raises(RuntimeError, match="after close"):
        log.log({"frames": 1, "wall_s": 1.0})


def test_unknown_logger_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown logger 'nope'; choose from csv, "):
        RunLogger(tmp_path, total_frames=None, loggers=("csv", "nope"))


class FailsToOpen:
    def __init__(self, run: RunInfo) -> None:
        raise ConfigError("cannot open")


class FailsToClose(ListSink):
    def close(self) -> None:
        super().close()
        raise OSError(28, "No space left on device")


def test_a_sink_that_fails_to_open_closes_those_opened_before(tmp_path, toy, monkeypatch):
    monkeypatch.setitem(LOGGERS, "broken", FailsToOpen)
    with pytest.raises(ConfigError, match="cannot open"):
        RunLogger(tmp_path, total_frames=None, loggers=("toy", "broken", "toy"))
    (opened,) = toy.made
    assert opened.closed


def test_every_sink_is_closed_when_one_fails_to_close(tmp_path, toy, monkeypatch):
    monkeypatch.setitem(LOGGERS, "full_disk", FailsToClose)
    log = RunLogger(tmp_path, total_frames=None, loggers=("toy", "full_disk", "toy"))
    with pytest.raises(OSError, match="No space"):
        log.close()
    assert [s.closed for s in toy.made] == [True, True, True]
    log.close()  # already closed: nothing more is raised


def test_default_loggers():
    assert DEFAULT_LOGGERS == ("csv", "tensorboard", "console")
    assert set(DEFAULT_LOGGERS) | {"wandb"} <= set(LOGGERS)


def test_package_import_is_light():
    assert_imports_without(("seedbed.loggers",), ("torch", "wandb", "matplotlib"))


def test_a_sink_registered_by_name_is_fed_and_bad_ones_are_refused(tmp_path):
    ListSink.made = []
    seedbed.loggers.register("listed", ListSink)
    try:
        seedbed.loggers.register("listed", ListSink)  # the same again: nothing
        with RunLogger(tmp_path, total_frames=None, progress=False, loggers=("listed",)) as log:
            log.log({"frames": 1, "wall_s": 0.1})
        assert ListSink.made[0].rows == [{"frames": 1, "wall_s": 0.1}]
    finally:
        seedbed.loggers.unregister("listed")
    assert "listed" not in LOGGERS
    with pytest.raises(ConfigError, match="a logger named 'csv' is registered already"):
        seedbed.loggers.register("csv", dict)
    with pytest.raises(ConfigError, match="is not a sink factory"):
        seedbed.loggers.register("mine", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="one of seedbed's own"):
        seedbed.loggers.unregister("csv")
    assert "mine" not in seedbed.loggers.LOGGERS


def test_a_run_feeds_the_default_sinks_then_wandb_then_its_loggers_once_each():
    assert sinks(TrainConfig()) == ("csv", "tensorboard", "console")
    cfg = TrainConfig(wandb=True, loggers=("jsonl", "csv", "wandb"))
    assert sinks(cfg) == ("csv", "tensorboard", "console", "wandb", "jsonl")


def test_an_unknown_logger_is_refused_with_the_settings():
    with pytest.raises(ConfigError, match="unknown logger 'jsonl'; choose from csv, "):
        resolve([{"loggers": "jsonl"}])


# TensorBoard


def _tb_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_tensorboard_resume_purges_the_events_after_the_checkpoint(tmp_path):
    with RunLogger(tmp_path, total_frames=None, loggers=("tensorboard",)) as log:
        for i in range(1, 6):
            log.log({"frames": i * 100, "wall_s": float(i), "mean_return": float(i)})
    assert _tb_steps(tmp_path, "mean_return") == [100, 200, 300, 400, 500]
    # The run died at 500 frames; its checkpoint was at 300.
    with RunLogger(tmp_path, total_frames=None, resume_frames=300, loggers=("tensorboard",)) as log:
        log.log({"frames": 400, "wall_s": 4.5, "mean_return": 40.0, "loss": None})
    assert _tb_steps(tmp_path, "mean_return") == [100, 200, 300, 400]


# Weights & Biases, offline


@pytest.fixture
def wandb_env(tmp_path_factory, monkeypatch):
    """wandb with no credentials, no server it could reach and no files outside tmp."""
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'seedbed[wandb]')")
    home = tmp_path_factory.mktemp("wandb-home")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))  # no such file: no saved key
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there


def _config(run_dir: Path, **settings: Any) -> RunConfig:
    base = {"run_dir": str(run_dir), "wandb": True, "wandb_mode": "offline", "seed": 7}
    return resolve([{**base, **settings}])


def _wandb_logger(run_dir: Path, config: RunConfig, **kwargs: Any) -> RunLogger:
    return RunLogger(
        run_dir, total_frames=1000, progress=False, loggers=("wandb",), config=config, **kwargs
    )


def read_wandb_records(path: Path) -> list[Any]:
    """The records of a .wandb file: a LevelDB-style log of protobuf ``Record`` messages.

    After a 7-byte header (``:W&B``, magic 0xBEE1, version 0), the file is 32 KiB blocks of
    chunks, each a CRC-32 of its type and data, its length, its type (1 whole record, 2 first,
    3 middle, 4 last part of one) and its data; a block's last < 7 bytes are padding.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:7] == b":W&B\xe1\xbe\x00", data[:7]
    block, pos, parts, records = 32 * 1024, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zeros past the end of what was written
            break
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad chunk at {pos}"
        parts += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    assert parts == b"", "the file ends inside a record"
    return records


def _items(items) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_offline_run(folder: Path) -> dict[str, Any]:
    """What one offline W&B run folder holds: its run record, config and history rows."""
    (log,) = folder.glob("run-*.wandb")
    records = read_wandb_records(log)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = _items(run.config.update)
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update(_items(r.config.update))
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    return {"run": run, "config": config, "history": history}


def _offline_runs(run_dir: Path) -> list[Path]:
    """The offline W&B runs in the order they were written: their names hold the time only to
    the second, and then the run's id."""
    return sorted((run_dir / "wandb").glob("offline-run-*"), key=lambda p: p.stat().st_mtime_ns)


def _metrics(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History rows without W&B's own keys (_step, _runtime, _timestamp)."""
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in history]


def test_wandb_offline_run_holds_the_rows_and_the_config(tmp_path, wandb_env, no_leaks):
    rows = [
        {"frames": 100, "wall_s": 1.0, "mean_return": None, "loss": 0.5},
        {"frames": 250, "wall_s": 2.0, "mean_return": 12.5, "loss": 0.25},
        {"frames": 400, "wall_s": 3.0, "mean_return": 20.0, "loss": None, "episodes": 9},
    ]
    with _wandb_logger(tmp_path, _config(tmp_path, wandb_project="seedbed-tests")) as log:
        for row in rows:
            log.log(row)
    (folder,) = _offline_runs(tmp_path)
    run_id = (tmp_path / ID_FILE).read_text().strip()
    assert folder.name.endswith(f"-{run_id}")
    found = read_offline_run(folder)
    assert found["run"].run_id == run_id
    assert found["run"].project == "seedbed-tests"
    assert found["run"].display_name == tmp_path.name  # no --wandb-run-name: the run dir's
    assert [row["_step"] for row in found["history"]] == [100, 250, 400]
    # None values are left out, not logged as nulls.
    assert _metrics(found["history"]) == [
        {k: v for k, v in row.items() if v is not None} for row in rows
    ]
    config = found["config"]
    assert (config["seed"], config["wandb_mode"], config["agent"]) == (7, "offline", "ppo")
    assert config["env"] == "CartPole-v1"
    assert isinstance(config["ppo"], dict) and "lr" in config["ppo"]  # the agent's section


def test_wandb_resume_continues_the_same_run(tmp_path, wandb_env, no_leaks):
    config = _config(tmp_path, wandb_run_name="named")
    with _wandb_logger(tmp_path, config) as log:
        for frames in (100, 200, 300):
            log.log({"frames": frames, "wall_s": frames / 100})
    run_id = (tmp_path / ID_FILE).read_text().strip()
    # The run stopped; it resumes from its checkpoint at 200 frames.
    with _wandb_logger(tmp_path, config, resume_frames=200) as log:
        for frames in (300, 400):
            log.log({"frames": frames, "wall_s": frames / 100})
    first, second = (read_offline_run(f) for f in _offline_runs(tmp_path))
    assert first["run"].run_id == second["run"].run_id == run_id
    assert second["run"].display_name == "named"
    assert [row["_step"] for row in first["history"]] == [100, 200, 300]
    assert [row["_step"] for row in second["history"]] == [300, 400]
    # A fresh run in the same folder is a new W&B run.
    earlier = set(_offline_runs(tmp_path))
    with _wandb_logger(tmp_path, config) as log:
        log.log({"frames": 50, "wall_s": 0.5})
    assert (tmp_path / ID_FILE).read_text().strip() != run_id
    (fresh,) = set(_offline_runs(tmp_path)) - earlier
    assert read_offline_run(fresh)["run"].run_id != run_id


def test_missing_wandb_is_a_one_line_config_error(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets when not installed
    with pytest.raises(ConfigError) as raised:
        RunLogger(
            tmp_path,
            total_frames=None,
            progress=False,
            loggers=(*DEFAULT_LOGGERS, "wandb"),
            config=_config(tmp_path),
        )
    message = str(raised.value)
    assert "pip install 'seedbed[wandb]'" in message
    assert "\n" not in message


@pytest.mark.timeout(60)
def test_wandb_online_without_credentials_fails_in_one_line(tmp_path, wandb_env, no_leaks):
    with pytest.raises(ConfigError) as raised:
        _wandb_logger(tmp_path, _config(tmp_path, wandb_mode="online"))
    message = str(raised.value)
    assert "wandb login" in message and "--wandb-mode offline" in message
    assert "\n" not in message
    assert not (tmp_path / "wandb").exists()  # it stopped before making a W&B run


@pytest.mark.timeout(60)
def test_wandb_unreachable_server_fails_in_one_line(tmp_path, wandb_env, monkeypatch, no_leaks):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # well formed, never checked: no server
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    with pytest.raises(SeedbedError) as raised:
        _wandb_logger(tmp_path, _config(tmp_path, wandb_mode="online"))
    message = str(raised.value)
    assert message.startswith("--wandb: W&B could not start the run (")
    assert "--wandb-mode offline" in message and "\n" not in message


def test_wandb_sink_needs_the_run_config(tmp_path):
    with pytest.raises(ConfigError, match="needs config="):
        RunLogger(tmp_path, total_frames=None, loggers=("wandb",))


@pytest.mark.slow
def test_cartpole_run_logs_to_wandb_offline(tmp_path, wandb_env, no_leaks):
    from seedbed.runtime.train import train

    run_dir = tmp_path / "run"
    config = resolve([tiny_settings(run_dir, wandb=True, wandb_mode="offline", energy=False)])
    summary = train(config)
    (folder,) = _offline_runs(run_dir)
    found = read_offline_run(folder)
    assert found["run"].run_id == (run_dir / ID_FILE).read_text().strip()
    assert found["config"]["actors"] == 2 and found["config"]["wandb"] is True
    metrics = read_metrics(run_dir)
    steps = [row["_step"] for row in found["history"]]
    # Every metrics.csv row reached W&B, at its frames, the last at the run's final count.
    assert steps == [int(f) for f in metrics["frames"]]
    assert steps[-1] == summary["frames"] >= 3000
    assert [row["episodes"] for row in found["history"]] == [int(n) for n in metrics["episodes"]]
