"""Shared fixtures: tiny, fast training settings and a check that runs leave nothing behind."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest


def pytest_terminal_summary(terminalreporter) -> None:
    """Say in one line when the Football tests were skipped for want of gfootball, so that
    `make test` shows it among the results rather than only in the skip list."""
    skipped = terminalreporter.stats.get("skipped", [])
    reason = "gfootball is not installed"  # test_football.py's skip reason
    if any("test_football.py" in r.nodeid and reason in str(r.longrepr) for r in skipped):
        terminalreporter.write_line(
            "Football tests skipped: gfootball is not installed (`make football` installs it)"
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stop at once where ``--dist loadgroup`` did not tag the grouped tests: the Ray tests on
    both workers at once kill each other's actors (a pytest that pytest-xdist cannot tag, as
    9.2 with xdist 3.8, does that silently)."""
    if not config.getoption("loadgroup", False):  # set on xdist's workers alone (not -n 0)
        return
    untagged = [
        i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid
    ]
    if untagged:
        raise pytest.UsageError(
            f"pytest-xdist did not group {untagged[0]} (and {len(untagged) - 1} more): this "
            "pytest and pytest-xdist do not work together; install those constraints.txt pins"
        )


def shm_blocks() -> set[str]:
    """The shared-memory blocks on this machine now."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("psm_")}


def leaked_shm(before: set[str], settle_s: float = 10.0) -> set[str]:
    """Blocks made since ``before`` that no process outside this test's own tree holds, and that
    are still there ``settle_s`` seconds on.

    Another seedbed run beside the suite (another test on a parallel worker, or another test
    session) makes and frees blocks of its own meanwhile; while it runs, its processes map or
    hold them open, so they are not counted. A run killed there leaves its blocks unheld for the
    moment its resource tracker takes to unlink them: the wait lets them go.
    """
    deadline = time.monotonic() + settle_s
    while True:
        unheld = _unheld(shm_blocks() - before)
        if not unheld or time.monotonic() >= deadline:
            return unheld
        time.sleep(0.2)


def _unheld(new: set[str]) -> set[str]:
    """The blocks among ``new`` that no process outside this test's own tree maps or holds open."""
    if not new:
        return set()
    me = psutil.Process()
    ours = {me.pid} | {p.pid for p in me.children(recursive=True)}
    held = set()
    for pid in psutil.pids():
        if pid in ours:
            continue
        for listing in (f"/proc/{pid}/maps", f"/proc/{pid}/fd"):
            try:
                if listing.endswith("maps"):
                    with open(listing) as f:
                        text = f.read()
                else:
                    text = " ".join(os.readlink(f"{listing}/{fd}") for fd in os.listdir(listing))
            except OSError:  # gone meanwhile, or not ours to read
                continue
            held |= {name for name in new if f"/dev/shm/{name}" in text}
    return new - held


def _helper(p: psutil.Process) -> bool:
    """Whether ``p`` is one of multiprocessing's own: the resource tracker, or the fork server
    actors start from (it lives as long as the process that started it). Actors forked from
    the server have its command line but a parent that has it too."""
    line = " ".join(p.cmdline())
    if "resource_tracker" in line:
        return True
    return "multiprocessing.forkserver" in line and "multiprocessing.forkserver" not in " ".join(
        p.parent().cmdline()
    )


def workers(parent: psutil.Process | None = None, recursive: bool = False) -> list[psutil.Process]:
    """The live processes under ``parent`` (this one by default), less multiprocessing's
    resource tracker and fork server; with ``recursive``, actors forked from the server too. A
    process that exits or turns zombie while it is looked at is left out: a zombie has no
    command line, and asking for one raises."""
    found = []
    for p in (parent or psutil.Process()).children(recursive=recursive):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _helper(p):
                found.append(p)
        except psutil.Error:
            continue
    return found


def alive(processes: list[psutil.Process]) -> list[int]:
    """The pids among ``processes`` still running, zombies aside."""

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return [p.pid for p in processes if running(p)]


@pytest.fixture(autouse=True)
def reap_children():
    """Kill whatever a test left running, so that one failing test stays one failure: a
    training it started and never stopped would otherwise fail every later leak check and
    slow the rest of the suite. ``no_leaks`` reports such processes before this runs."""
    yield
    left = workers(recursive=True)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)


@pytest.fixture
def no_leaks():
    """Fail if the test leaves shared-memory blocks or child processes behind."""
    before = shm_blocks()
    yield
    leaked = leaked_shm(before)
    assert not leaked, f"leaked shared memory: {leaked}"
    orphans = workers(recursive=True)
    assert not orphans, f"orphan processes: {[p.pid for p in orphans]}"


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT, as Ctrl-C would.

    A child inherits an ignored SIGINT from a parent started in the background by a shell
    without job control (``cmd &`` in a script, as some CI runners do), and Python then never
    raises KeyboardInterrupt; a terminal's Ctrl-C always finds the default. Restore it.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc, timeout: float = 240) -> tuple[int, str, str]:
    """Wait for a child started with text pipes, or with its output in the file ``proc.log``
    (then returned as both stdout and stderr); kill it and fail the test if it hangs, with the
    tails of the actor logs in ``proc.logs_dir`` where it has one, which say why a learner
    waited."""
    import subprocess

    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err = err if err is not None else Path(proc.log).read_text()
        logs = sorted(Path(getattr(proc, "logs_dir", "/nonexistent")).glob("actor-*.log"))
        seen = "".join(f"\n--- {p.name}:\n{p.read_text()[-1500:]}" for p in logs)
        pytest.fail(f"timed out; stderr: {err[-3000:]}{seen}")
    if hasattr(proc, "log"):
        out = err = Path(proc.log).read_text()
    return proc.returncode, out, err


def wait_for_frames(run_dir: Path, frames: int, proc) -> None:
    """Wait until the run in ``run_dir`` has logged ``frames``, while ``proc`` stays alive."""
    from seedbed.telemetry import read_metrics

    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        metrics = read_metrics(run_dir) if (run_dir / "metrics.csv").is_file() else {}
        if len(metrics.get("frames", [])) and metrics["frames"][-1] >= frames:
            return
        assert time.monotonic() < deadline, f"training never reached {frames} frames"
        time.sleep(0.2)


def tiny_settings(run_dir: Path, **overrides) -> dict:
    """Settings for a short CartPole run that finishes in seconds."""
    settings = {
        "env": "CartPole-v1",
        "actors": 2,
        "envs_per_actor": 4,
        "unroll": 8,
        "batch": 4,
        "inference_batch": 8,
        "total_frames": 3000,
        "target_return": None,
        "run_dir": str(run_dir),
        "progress": False,
        "log_every_s": 0.2,
        "checkpoint_every_s": 1000.0,
    }
    settings.update(overrides)
    return settings


def assert_imports_without(modules: tuple[str, ...], heavy: tuple[str, ...]) -> None:
    """Import ``modules`` in a fresh interpreter and fail if any of ``heavy`` came with them."""
    import subprocess
    import sys

    code = (
        f"import sys\nimport {', '.join(modules)}\n"
        f"heavy = [m for m in {heavy!r} if m in sys.modules]\nassert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: The example plug-in package (``seedbed_toyplug``) lives here, outside seedbed.
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "examples" / "plugin"
PLUGIN = "seedbed_toyplug"


def forget_toyplug() -> None:
    """Undo what importing the example plug-in registered, and forget the import, so that a
    later import registers it again."""
    module = sys.modules.get(PLUGIN)
    if module is not None:
        module.unregister()
    for name in [m for m in sys.modules if m == PLUGIN or m.startswith(PLUGIN + ".")]:
        del sys.modules[name]


@contextlib.contextmanager
def toyplug_registered() -> Iterator[ModuleType]:
    """The example plug-in imported, so registered, for a while (``forget_toyplug`` after)."""
    added = str(PLUGIN_DIR) not in sys.path
    if added:
        sys.path.insert(0, str(PLUGIN_DIR))
    try:
        yield importlib.import_module(PLUGIN)  # registers on import
    finally:
        forget_toyplug()
        if added:
            sys.path.remove(str(PLUGIN_DIR))


@pytest.fixture
def plugin_on_path(monkeypatch):
    """The example plug-in importable here and in every process started from here; what the
    test registers by importing it is undone after."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGIN_DIR), path])))
    yield
    forget_toyplug()


BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_report(script: str, args: list[str], out: Path, timeout: float = 120) -> dict:
    """Run ``bench/SCRIPT ARGS --out OUT`` as a user would; its JSON report, once it exited 0."""
    run = subprocess.run(
        [sys.executable, script, *args, "--out", str(out)],
        cwd=BENCH,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(out.read_text())
