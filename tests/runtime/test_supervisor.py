"""Actor processes: started from a fork server that has the actor code loaded, restarted when
they die, in the learner's environment of the moment."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import pytest

from seedbed.runtime.supervisor import ActorSupervisor, actor_context
from tests.conftest import workers


class Slot(int):
    """The endpoint ``connect`` gives here: the slot number alone."""

    def close_parent_copy(self) -> None:
        pass


def _report(endpoint, queue, seed: int) -> None:
    """An actor body that says what it found, then waits to be stopped."""
    queue.put(
        {
            "slot": int(endpoint),
            "seed": seed,
            "variable": os.environ.get("SEEDBED_TEST_VARIABLE"),
            "actor_loaded": "seedbed.actor" in sys.modules,
            "torch_loaded": "torch" in sys.modules,
            "pid": os.getpid(),
        }
    )
    # Flush before anyone may kill us: an actor killed while its queue's feeder thread holds
    # the queue's write lock would leave the lock taken, and its restart could never report.
    queue.close()
    queue.join_thread()
    time.sleep(60)


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here"
)
def test_actors_fork_from_a_loaded_server_in_the_learners_environment(monkeypatch, no_leaks):
    context = actor_context()
    assert context.get_start_method() == "forkserver"
    queue = context.Queue()
    # Set after the server started: a plain fork would miss it.
    monkeypatch.setenv("SEEDBED_TEST_VARIABLE", "now")
    supervisor = ActorSupervisor(2, Slot, _report, (queue,), 10, context, max_restarts=1)
    supervisor.start()
    try:
        first = [queue.get(timeout=30) for _ in range(2)]
        assert sorted(r["slot"] for r in first) == [0, 1]
        assert all(r["variable"] == "now" for r in first)
        # The server imported the actor's code before forking, and never torch.
        assert all(r["actor_loaded"] and not r["torch_loaded"] for r in first)
        # The server is no worker of ours; the actors, its children, are.
        found = {p.pid for p in workers(recursive=True)}
        assert {r["pid"] for r in first} | set(supervisor.pids()) <= found
        killed = supervisor.kill(0)
        again = queue.get(timeout=30)
        assert again["slot"] == 0 and again["pid"] != killed and supervisor.restarts == 1
        assert again["seed"] != next(r["seed"] for r in first if r["slot"] == 0)
    finally:
        supervisor.stop()
        queue.close()
        queue.join_thread()
