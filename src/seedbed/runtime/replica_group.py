"""Learner replicas on several machines: what replica 0 shares with the others, and a lost replica.

``seedbed train`` started by torchrun (or by the Ray launcher, which describes the group in the
same variables) is one replica of a learner whose other replicas run elsewhere, maybe on machines
that share no filesystem. So replica 0 alone reads and writes the run directory, and the others
get from it, over the process group, what they would have read there: the run's settings
(``share_config``: a resumed run's ``config.yaml`` is on replica 0's machine) and, with
``--resume``, the checkpoint (``share_resume``). An error replica 0 meets meanwhile (a run
directory that already holds a run) is raised on every replica, as the same line.

A replica whose process or machine dies breaks the next collective of the others; each then
holds a roll call and stops with one line naming the lost replica (``replica_lost``). The run
keeps its newest complete checkpoint, which ``--resume`` continues with the same replicas.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from seedbed.config import RunConfig
from seedbed.errors import ConfigError, SeedbedError
from seedbed.replicate import ReplicaContext, group_failure, lost_replicas
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import latest_checkpoint

Found = tuple[Path, dict[str, Any]]


def replica_device(config: RunConfig) -> torch.device:
    """This process's device: the CPU, or with ``--device cuda`` the GPU of its local rank."""
    if config.train.device == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.device_count() <= local:
        raise SeedbedError(
            f"--device cuda: this is local replica {local} of its machine, which has "
            f"{torch.cuda.device_count()} GPUs; start at most one replica per GPU "
            "(torchrun --nproc-per-node)"
        )
    return torch.device("cuda", local)


def share_config(replica: ReplicaContext, config: RunConfig) -> RunConfig:
    """Replica 0's settings, on every replica (as YAML text: nothing is unpickled)."""
    if replica.num_replicas == 1:
        return config
    text = from_primary(replica, lambda: yaml.safe_dump(config.to_dict()).encode())
    if replica.is_primary:
        return config
    shared = resolve([yaml.safe_load(text.decode())])
    if shared.train.device != config.train.device:
        raise ConfigError(
            f"replica 0 runs with --device {shared.train.device} and replica "
            f"{replica.replica_id} with {config.train.device}; give every replica the same flags"
        )
    return shared


def share_resume(replica: ReplicaContext, prepare: Callable[[], Found | None]) -> Found | None:
    """What ``prepare`` (``RunFiles.prepare``: check the run directory, save the settings, load
    the checkpoint to resume from) gives replica 0, on every replica; only replica 0 calls it.

    The checkpoint travels as ``torch.save`` bytes and is read back with ``weights_only``, as
    from the file.
    """
    if replica.num_replicas == 1:
        return prepare()
    found: Found | None = None

    def make() -> bytes:
        nonlocal found
        found = prepare()
        if found is None:
            return b""
        buffer = io.BytesIO()
        torch.save({"path": str(found[0]), "payload": found[1]}, buffer)
        return buffer.getvalue()

    data = from_primary(replica, make)
    if replica.is_primary or not data:
        return found
    shared = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return Path(shared["path"]), shared["payload"]


def from_primary(replica: ReplicaContext, make: Callable[[], bytes]) -> bytes:
    """The bytes ``make()`` returns on replica 0, on every replica (only replica 0 calls it).

    Raises:
        SeedbedError: The one ``make()`` raised on replica 0, on every replica.
    """
    data, failed = b"", None
    if replica.is_primary:
        try:
            data = make()
        except SeedbedError as e:
            data, failed = str(e).encode(), e
    header = torch.tensor([len(data), failed is not None], dtype=torch.int64)
    size, error = replica.broadcast(header).tolist()
    if size:
        if replica.is_primary:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buffer = torch.zeros(size, dtype=torch.uint8)
        data = replica.broadcast(buffer).numpy().tobytes()
    if failed is not None:
        raise failed
    if error:
        raise SeedbedError(data.decode())
    return data


class ReplicaLost(SeedbedError):
    """A replica was lost mid-run (its process or machine died), as a surviving one tells it."""


@contextlib.contextmanager
def lost_replica_line(replica: ReplicaContext, config: RunConfig) -> Iterator[None]:
    """Turn a collective that failed because a replica was lost into ``replica_lost``'s line."""
    try:
        yield
    except Exception as e:
        if replica.num_replicas == 1 or not group_failure(e):
            raise
        raise replica_lost(replica, config, e) from e


def replica_lost(replica: ReplicaContext, config: RunConfig, error: BaseException) -> ReplicaLost:
    """The one line for a replica lost mid-run, as this (surviving) replica tells it."""
    n, me = replica.num_replicas, replica.replica_id
    lost = lost_replicas()
    first = _first_words(error)
    if len(lost or ()) == 1:
        what = f"replica {lost[0]} of {n} was lost (its process or machine died; {first})"
    elif lost:
        who = ", ".join(map(str, lost))
        what = f"replicas {who} of {n} were lost (their processes or machines died; {first})"
    elif lost is None:
        what = f"the replicas' rendezvous host was lost ({first})"
    else:
        what = f"a collective between the {n} replicas failed ({first})"
    run_dir = Path(config.train.run_dir or ".")
    if replica.is_primary:
        newest = latest_checkpoint(run_dir)
        kept = f"its newest complete checkpoint is {newest}" if newest else "it has no checkpoint"
    else:
        kept = f"replica 0 keeps its newest complete checkpoint in {run_dir}"
    return ReplicaLost(
        f"{what}; replica {me} stopped the run, and {kept}: start all {n} replicas again "
        "with --resume to continue"
    )


def _first_words(error: BaseException) -> str:
    """What a collective's error says, less gloo's source path and advice: e.g. ``Read error
    [10.0.0.2]:9887: Connection reset by peer``."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0][:200]
