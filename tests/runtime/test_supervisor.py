"""Actor processes: started from a fork server that has the actor code loaded, restarted when
they die, in the learner's environment of the moment."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

from seedbed.runtime.supervisor import ActorSupervisor, actor_context
from tests.conftest import workers


class Slot(int):
    """The endpoint ``connect`` gives here: the slot number alone."""

    def close_parent_copy(self) -> None:
        pass


def _report(endpoint, folder: str, seed: int) -> None:
    """An actor body that says what it found, in a file of its own, then waits to be stopped.

    A file, not a queue shared by the actors: the test kills an actor once its report is read,
    and a queue's writer may still hold the queue's write lock at that moment (the bytes are
    readable before the lock is given back), so a restarted actor could never report again.
    """
    found = {
        "slot": int(endpoint),
        "seed": seed,
        "variable": os.environ.get("SEEDBED_TEST_VARIABLE"),
        "actor_loaded": "seedbed.actor" in sys.modules,
        "torch_loaded": "torch" in sys.modules,
        "pid": os.getpid(),
    }
    path = Path(folder) / f"{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(found))
    path.with_suffix(".tmp").replace(path)
    time.sleep(60)


def _reports(folder: Path, count: int, timeout_s: float = 30.0) -> list[dict]:
    """The first ``count`` reports written into ``folder``, waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while len(found := sorted(folder.glob("*.json"), key=os.path.getmtime)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} actors reported"
        time.sleep(0.05)
    return [json.loads(p.read_text()) for p in found]


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here"
)
def test_actors_fork_from_a_loaded_server_in_the_learners_environment(
    tmp_path, monkeypatch, no_leaks
):
    context = actor_context()
    assert context.get_start_method() == "forkserver"
    reports = tmp_path / "reports"
    reports.mkdir()
    # Set after the server started: a plain fork would miss it.
    monkeypatch.setenv("SEEDBED_TEST_VARIABLE", "now")
    supervisor = ActorSupervisor(2, Slot, _report, (str(reports),), 10, context, max_restarts=1)
    supervisor.start()
    try:
        first = _reports(reports, 2)
        assert sorted(r["slot"] for r in first) == [0, 1]
        assert all(r["variable"] == "now" for r in first)
        # The server imported the actor's code before forking, and never torch.
        assert all(r["actor_loaded"] and not r["torch_loaded"] for r in first)
        # The server is no worker of ours; the actors, its children, are.
        found = {p.pid for p in workers(recursive=True)}
        assert {r["pid"] for r in first} | set(supervisor.pids()) <= found
        killed = supervisor.kill(0)
        again = next(r for r in _reports(reports, 3) if r["pid"] not in {x["pid"] for x in first})
        assert again["slot"] == 0 and again["pid"] != killed and supervisor.restarts == 1
        assert again["seed"] != next(r["seed"] for r in first if r["slot"] == 0)
    finally:
        supervisor.stop()
