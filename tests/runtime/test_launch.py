"""``seedbed launch --ray``: a learner and remote actors as Ray actors on a local 2-CPU Ray."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from seedbed.errors import SeedbedError
from seedbed.launch import Placement, actors_to_start, local_actors_per_replica
from tests.conftest import finish, interruptible, wait_for_frames

pytest.importorskip("ray", reason="Ray is the 'ray' extra (in dev)")
# One worker runs every test that starts a Ray cluster: nothing_left_behind sees all of Ray's
# processes on the machine, another test's cluster included.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

RAY_PARTS = ("raylet", "gcs_server", "ray::", "default_worker", "dashboard", "log_monitor")


def ray_processes() -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        with_args = " ".join(p.info["cmdline"] or ())
        if any(part in with_args for part in RAY_PARTS):
            found.add(p.info["pid"])
    return found


@pytest.fixture
def nothing_left_behind():
    """Fail if Ray's processes outlive the launch. They exit on their own once the launch has
    shut Ray down, in a few seconds on an idle machine and in over 20 with the suite's other
    worker busy beside them (Ray's log monitor and dashboard poll for the cluster's end)."""
    before = ray_processes()
    yield
    deadline = time.monotonic() + 60
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [" ".join(psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]


def launch(run_dir, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seedbed", "launch", "--ray", "--actors", "2"]
        + ["--actor-cpus", "0.5", "--run-dir", str(run_dir), "--log-every-s", "0.2", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,  # one test stops it with SIGINT
    )


def test_launch_trains_and_leaves_nothing_behind(tmp_path, nothing_left_behind):
    code, out, err = finish(launch(tmp_path / "run", "--target-return", "195"))
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return"
    assert summary["remote_actors"]["connections"] == 2
    assert "target return 195 reached" in out


def actor_hosts() -> dict[int, psutil.Process]:
    procs = psutil.process_iter(["cmdline"])  # info, not cmdline(): a zombie has none
    return {p.pid: p for p in procs if "ActorHost" in " ".join(p.info["cmdline"] or ())}


def connected(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` holds a connection to the learner's port (a Ray worker holds others, to
    Ray's own services, from its start)."""
    try:
        conns = proc.net_connections("tcp")
    except psutil.Error:
        return False
    return any(
        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port for c in conns
    )


def test_a_dead_actor_is_restarted_by_ray_and_ctrl_c_keeps_the_run(tmp_path, nothing_left_behind):
    run = tmp_path / "run"
    proc = launch(run, "--target-return", "none", "--total-frames", "100000000")
    wait_for_frames(run, 20_000, proc)
    before = actor_hosts()
    assert before, "no actor process found"
    next(iter(before.values())).kill()
    # Ray starts the killed actor again; the run goes on until the new one holds a connection.
    port = int((run / "listen_address").read_text().strip().rpartition(":")[2])
    deadline = time.monotonic() + 120
    while not any(connected(p, port) for pid, p in actor_hosts().items() if pid not in before):
        assert proc.poll() is None and time.monotonic() < deadline, "the actor never came back"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    # Ctrl-C stopped every part and kept the run.
    assert summary["stop_reason"] == "interrupted" and summary["frames"] >= 20_000
    assert summary["remote_actors"]["connections"] >= 3  # the restarted actor came back


@pytest.mark.parametrize(
    ("placement", "resources", "started"),
    [
        (Placement(2, 1.0, 1.0), {"CPU": 3.0}, 2),
        (Placement(2, 0.5, 1.0), {"CPU": 2.0}, 2),
        (Placement(3, 0.1, 0.0), {"CPU": 0.3}, 3),  # 0.3 / 0.1 is 2.9999999999999996
        (Placement(2, 1.0, 1.0, fit_actors=True), {"CPU": 2.0}, 1),
        (Placement(8, 0.0, 1.0), {"CPU": 1.0}, 8),
    ],
)
def test_actors_to_start_counts_what_fits(placement, resources, started):
    assert actors_to_start(placement, resources) == started


@pytest.mark.parametrize(
    ("placement", "resources", "says"),
    [
        (Placement(2, 1.0, 1.0), {"CPU": 2.0}, "ask for 3 CPUs; lower --actors or --actor-cpus, "),
        (Placement(2, 64.0, 1.0, fit_actors=True), {"CPU": 2.0}, "not one actor fits"),
        (Placement(2, 1.0, 4.0), {"CPU": 2.0}, "the learner asks for 4 CPUs; lower --learner-cpus"),
        (Placement(2, 1.0, 1.0, 1.0), {"CPU": 8.0}, "has 0 GPUs and the learner asks for 1"),
    ],
)
def test_actors_to_start_refuses_what_cannot_run(placement, resources, says):
    with pytest.raises(SeedbedError, match=re.escape(says)):
        actors_to_start(placement, resources)


@pytest.mark.parametrize("flag", [("--listen", "127.0.0.1:0"), ("--remote-actors", "4")])
def test_a_listener_or_remote_slots_of_ones_own_are_refused_in_one_line(tmp_path, flag):
    """The launch sets both itself (every actor a Ray actor); a user's would be overwritten."""
    proc = subprocess.run(
        [sys.executable, "-m", "seedbed", "launch", "--ray", "--run-dir", str(tmp_path), *flag],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "drop --listen and --remote-actors" in line and not (tmp_path / "config.yaml").exists()


def test_no_room_for_every_actor_refuses_before_starting_any(tmp_path, nothing_left_behind):
    code, _, err = finish(launch(tmp_path / "run", "--actor-cpus", "1000"))  # the last flag wins
    assert code == 2, err[-3000:]
    assert err.count("seedbed: error:") == 1, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("seedbed: error: the Ray cluster has "), err[-3000:]
    assert line.endswith(
        "the learner (1 CPU) and 2 actors (1000 CPUs each) ask for 2001 CPUs, and not one actor "
        "fits; lower --actor-cpus or --learner-cpus"
    )
    assert "learner listening" not in err  # no learner started (the run directory was
    # checked, and so made, before Ray started)
    assert not list((tmp_path / "run" / "checkpoints").iterdir())


def test_fit_actors_starts_as_many_as_fit_and_says_so(tmp_path, nothing_left_behind):
    from ray._private.utils import get_num_cpus  # how a local Ray counts this machine's CPUs

    cpus = int(get_num_cpus())
    learner = 1.0 if cpus >= 2 else cpus / 2  # Ray takes whole CPUs, or fractions below one
    run = tmp_path / "run"
    proc = launch(
        run,
        *("--learner-cpus", f"{learner:g}", "--actor-cpus", f"{cpus - learner:g}"),
        *("--fit-actors", "--target-return", "none", "--total-frames", "20000"),
    )
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "the cluster has room for 1 of 2 actors; starting 1" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["launch"]["actors_asked"] == 2
    assert summary["launch"]["actors_placed"] == 1
    assert summary["remote_actors"]["connections"] == 1


def test_the_learner_listens_on_its_nodes_address_with_a_token():
    """On a cluster, the node's address Ray knows, not every interface (0.0.0.0); locally the
    CLI's 127.0.0.1. A token either way: other users of the machine cannot join."""
    from seedbed.launch import learner_settings

    cluster = learner_settings("/run/token", "10.1.2.3")
    assert cluster["listen"] == "10.1.2.3:0" and cluster["token_file"] == "/run/token"
    local = learner_settings("/run/token", None)
    assert "listen" not in local and local["token_file"] == "/run/token"


@contextlib.contextmanager
def ray_cluster(head_cpus: int, node_cpus: int):
    """A Ray cluster of two nodes on this machine with these logical CPUs; yields its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": head_cpus, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.fixture
def two_nodes(nothing_left_behind):
    """A Ray cluster of two nodes on this machine, 2 logical CPUs each."""
    with ray_cluster(2, 2) as address:
        yield address


def launch_replicas(address: str, run_dir, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seedbed", "launch", "--ray", address, "--learner-replicas", "2"]
        + ["--actor-cpus", "0.5", "--run-dir", str(run_dir), "--no-energy", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.distributed
def test_replicas_on_two_ray_nodes_train_cartpole_as_one_run(tmp_path, two_nodes):
    run = tmp_path / "run"
    proc = launch_replicas(two_nodes, run, "--target-return", "195", "--total-frames", "1500000")
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["learner_replicas"] == 2 and summary["replicas_in_sync"] is True
    launched = summary["launch"]
    assert launched["placement_strategy"] == "STRICT_SPREAD"
    replicas = launched["replicas"]
    assert [r["replica"] for r in replicas] == [0, 1] and [r["actors"] for r in replicas] == [1, 1]
    assert len({r["node_id"] for r in replicas}) == 2  # one replica on each node
    assert launched["overflow_actors"] == 0 and summary["remote_actors"] is None  # no listener
    assert "target return 195 reached" in out


@pytest.mark.parametrize(
    ("placement", "cpus", "local"),
    [
        (Placement(4, 1.0, 1.0, replicas=2), [3.0, 3.0], 2),  # every share fits
        (Placement(4, 1.0, 1.0, replicas=2), [8.0, 2.0], 1),  # the smaller node holds one
        (Placement(4, 1.0, 1.0, replicas=2), [8.0, 1.0, 2.0], 1),  # the two roomiest nodes
        (Placement(4, 1.0, 1.0, replicas=2), [8.0, 1.0], 0),  # room for the learner alone
        (Placement(4, 0.1, 0.2, replicas=2), [1.0, 0.3], 1),  # (0.3 - 0.2) / 0.1 is 0.99...98
        (Placement(4, 1.0, 1.0, replicas=2), [8.0], 2),  # one node: replicas share it, as before
    ],
)
def test_local_actors_are_what_the_least_roomy_replica_node_holds(placement, cpus, local):
    assert local_actors_per_replica(placement, [{"CPU": c} for c in cpus]) == local


def test_local_actors_count_only_nodes_with_the_learners_gpu():
    placement = Placement(4, 1.0, 1.0, 1.0, replicas=2)
    nodes = [{"CPU": 64.0}, {"CPU": 3.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}]
    assert local_actors_per_replica(placement, nodes) == 1


@pytest.fixture
def uneven_nodes(nothing_left_behind):
    """Two Ray nodes on this machine: 2 logical CPUs on the head, 1 on the other."""
    with ray_cluster(2, 1) as address:
        yield address


@pytest.mark.distributed
def test_actors_that_do_not_fit_on_a_replicas_node_connect_over_grpc(tmp_path, uneven_nodes):
    """The 1-CPU node holds a replica's learner (1 CPU) but not its actor (0.5): each replica
    runs its actor as a Ray actor wherever there is room, through the front door."""
    run = tmp_path / "run"
    proc = launch_replicas(uneven_nodes, run, "--target-return", "195", "--total-frames", "1500000")
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "each replica's node holds 0 actors of its 1; the other 2 actors run" in err, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["replicas_in_sync"] is True
    launched = summary["launch"]
    assert launched["placement_strategy"] == "STRICT_SPREAD" and launched["replica_cpus"] == 1
    assert (launched["local_actors"], launched["overflow_actors"]) == (0, 2), launched
    replicas = launched["replicas"]
    assert len({r["node_id"] for r in replicas}) == 2  # one replica on each node
    assert [(r["actors"], r["overflow_served"]) for r in replicas] == [(0, 1), (0, 1)], replicas
    assert launched["overflow_served"] == 2 == summary["remote_actors"]["connections"]
    assert "target return 195 reached" in out


def writes_under(proc: psutil.Process, folder) -> bool:
    return any(f.path.startswith(str(folder)) for f in proc.open_files())


@pytest.mark.distributed
@pytest.mark.parametrize("killed", [0, 1])
def test_a_replica_killed_on_ray_is_named_and_the_run_resumes(tmp_path, two_nodes, killed):
    from seedbed.runtime.checkpoint import list_checkpoints, load_checkpoint
    from tests.runtime.test_faults import assert_one_line_error

    run = tmp_path / "run"
    flags = ["--envs-per-actor", "4", "--unroll", "8", "--batch", "8", "--target-return", "none"]
    flags += ["--total-frames", "8000", "--checkpoint-every-s", "0.5", "--log-every-s", "0.2"]
    proc = launch_replicas(two_nodes, run, *flags)
    deadline = time.monotonic() + 120
    while not list_checkpoints(run / "checkpoints"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    procs = psutil.process_iter(["cmdline"])
    hosts = [p for p in procs if "ReplicaHost" in " ".join(p.info["cmdline"] or ())]
    assert len(hosts) == 2, [p.info["cmdline"] for p in hosts]
    primary = [h for h in hosts if writes_under(h, run)]  # replica 0 keeps the CSV log open
    assert len(primary) == 1, [h.open_files() for h in hosts]
    (primary[0] if killed == 0 else next(h for h in hosts if h not in primary)).kill()
    code, _, err = finish(proc)
    assert code == 2, err[-3000:]
    line = assert_one_line_error(err, "of 2 on Ray node", "died", "--resume")
    assert f"replica {killed} of 2" in line, line
    frames = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["frames"]
    assert 0 < frames < 8000 and not (run / "summary.json").exists()
    if killed == 1:
        return  # resuming does not depend on which replica was lost: one resume is enough
    code, _, err = finish(launch_replicas(two_nodes, run, *flags, "--resume"))
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames" and summary["frames"] >= 8000
    assert summary["replicas_in_sync"] is True


@pytest.mark.distributed
def test_replicas_on_a_one_node_ray_share_it_and_say_so(tmp_path, nothing_left_behind):
    run = tmp_path / "run"
    flags = ["--envs-per-actor", "4", "--unroll", "8", "--batch", "8", "--total-frames", "3000"]
    flags += ["--target-return", "none", "--learner-cpus", "0.5"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedbed", "launch", "--ray", "--learner-replicas", "2"]
        + ["--actor-cpus", "0.5", "--run-dir", str(run), "--no-energy", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "the Ray cluster has 1 node for 2 replicas: some replicas share a node" in err
    launched = json.loads((run / "summary.json").read_text())["launch"]
    assert launched["placement_strategy"] == "SPREAD"
    assert len({r["node_id"] for r in launched["replicas"]}) == 1
