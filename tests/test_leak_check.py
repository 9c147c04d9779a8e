"""The suite's leak checks count only what the test's own processes made and left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing import shared_memory

import psutil
import pytest

from tests.conftest import alive, leaked_shm, shm_blocks, workers

HOLD = """
import os, signal, sys, time
from multiprocessing import shared_memory
signal.signal(signal.SIGTERM, lambda *_: sys.exit())
block = shared_memory.SharedMemory(create=True, size=64)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {block.name}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
try:
    time.sleep(60)
finally:
    block.close()
    block.unlink()
"""


@pytest.fixture
def foreign_block(tmp_path):
    """A block made and held by a process outside this test's tree, as another seedbed run on
    the machine holds its own: the shell that starts it exits, so it is nobody's child here."""
    said = tmp_path / "said"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" "$1" &', HOLD, str(said)], check=True)
    deadline = time.monotonic() + 30
    while not said.exists():
        assert time.monotonic() < deadline, "the holder never started"
        time.sleep(0.05)
    pid, name = said.read_text().split()
    yield name
    os.kill(int(pid), signal.SIGTERM)  # it frees the block as it exits
    while name in shm_blocks() and time.monotonic() < deadline + 30:
        time.sleep(0.05)


def test_a_block_another_process_holds_is_not_a_leak(foreign_block):
    before = shm_blocks() - {foreign_block}  # as if it was made while the test ran
    assert foreign_block in shm_blocks()
    assert leaked_shm(before) == set()


def test_a_block_this_test_left_behind_is_a_leak(foreign_block):
    before = shm_blocks() - {foreign_block}
    left = shared_memory.SharedMemory(create=True, size=64)
    try:
        left.close()  # closed but never unlinked: nobody holds it any more
        assert leaked_shm(before, settle_s=0) == {left.name}
    finally:
        left.unlink()
    assert leaked_shm(before) == set()


def test_a_child_that_turns_zombie_is_neither_a_worker_nor_alive():
    """A child that exits and is not yet waited for has no command line to read: the process
    checks leave it out rather than raise, as a spawn helper exiting mid-check once did."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        found = {p.pid for p in workers()}
        assert child.pid not in found and sleeper.pid in found
        both = [psutil.Process(child.pid), psutil.Process(sleeper.pid)]
        assert alive(both) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
        child.wait()
