"""The Replicator on real gloo processes: collectives, replicated training, failures, examples.

Worker functions live at module level so that spawned replicas can import them by name. What
the replicas compute is checked against values computed here, in one process, by loops.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from seedbed.agents.base import optimizer_step
from seedbed.errors import SeedbedError
from seedbed.replicate import InputContext, ReplicaError, Replicator, spawn
from tests.conftest import finish

ROOT = Path(__file__).resolve().parents[1]
STEPS, GLOBAL_BATCH, LR = 5, 8, 0.1
CLIP = 0.05  # small enough that every step clips: the clip must see the averaged gradients
_OPS = ("sum", "mean", "min", "max")


# -- collectives ------------------------------------------------------------------------------


def _tree(r: int) -> dict:
    """A nested structure of several dtypes whose values depend on the replica id."""
    return {
        "floats": [torch.tensor([1.0, -2.0, 3.0]) * (r + 1), torch.full((2, 2), r - 0.5).double()],
        "ints": (torch.tensor([[r, 10 - r]]), 7 * r + 1),
        "bf16": torch.tensor([0.5, r], dtype=torch.bfloat16),
        "number": 0.25 * r,
    }


def _rows(r: int) -> dict:
    """Leaves whose first dimension divides by two replicas, for reduce_scatter."""
    return {"a": [torch.arange(4.0) * (r + 1)], "b": torch.arange(6).reshape(2, 3) + 10 * r}


def _collectives() -> dict:
    """Every collective once, on this replica's trees; the results go back to the test."""
    with Replicator() as rep:
        r = rep.replica_id
        out = {op: rep.all_reduce(_tree(r), op) for op in _OPS}
        out["all_gather"] = rep.all_gather(_tree(r))
        out["broadcast"] = rep.broadcast(_tree(r), src=rep.num_replicas - 1)
        out["reduce_scatter"] = rep.reduce_scatter(_rows(r))
        out["reduce_scatter_mean"] = rep.reduce_scatter(_rows(r), "mean")
        out["outputs"] = rep.reduce_outputs([{"loss": 1.0 + r}, {"loss": torch.tensor(3.0)}])
        rep.all_reduce(0)  # line up, then the last replica comes late to the barrier
        start = time.monotonic()
        if r == rep.num_replicas - 1 and rep.num_replicas > 1:
            time.sleep(0.5)
        rep.barrier()
        out["barrier_wait_s"] = time.monotonic() - start
        out["distributed"] = dist.is_initialized()
        return out


def _combine(op: str, *leaves):
    """One leaf reduced over replicas the slow way."""
    if not isinstance(leaves[0], torch.Tensor):
        total = {"sum": sum, "mean": sum, "min": min, "max": max}[op](leaves)
        return total / len(leaves) if op == "mean" else total
    stacked = torch.stack(leaves)
    if op == "mean":
        dtype = stacked.dtype if stacked.is_floating_point() else torch.float64
        return stacked.to(dtype).sum(0) / len(leaves)
    return {"sum": stacked.sum(0), "min": stacked.amin(0), "max": stacked.amax(0)}[op]


def _expected(n: int) -> dict:
    """What ``_collectives`` must return on replica r of n, as a function of r."""
    trees, rows = [_tree(r) for r in range(n)], [_rows(r) for r in range(n)]
    want = {op: pytree.tree_map(lambda *x, op=op: _combine(op, *x), *trees) for op in _OPS}
    want["all_gather"] = pytree.tree_map(
        lambda *x: torch.stack(x) if isinstance(x[0], torch.Tensor) else list(x), *trees
    )
    want["broadcast"] = trees[-1]
    for name, op in (("reduce_scatter", "sum"), ("reduce_scatter_mean", "mean")):
        want[name] = pytree.tree_map(lambda *x, op=op: _combine(op, *x), *rows)
    want["outputs"] = {"loss": (sum(1.0 + r for r in range(n)) + 3.0 * n) / (2 * n)}
    return want


def _assert_same(got, want) -> None:
    """Same structure, leaf types, dtypes, shapes and values."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert type(g) is type(w), (g, w)
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
        else:
            assert g == pytest.approx(w), (g, w)


def _check_collectives(results: list[dict]) -> None:
    n = len(results)
    want = _expected(n)
    for r, got in enumerate(results):
        for name in (*_OPS, "all_gather", "broadcast", "outputs"):
            _assert_same(got[name], want[name])
        for name in ("reduce_scatter", "reduce_scatter_mean"):  # replica r: the r-th row slice
            mine = pytree.tree_map(lambda x, r=r: x.chunk(n)[r], want[name])
            _assert_same(got[name], mine)


@pytest.mark.distributed
def test_collectives_on_nested_trees_over_two_replicas(no_leaks):
    results = spawn(2, _collectives)
    _check_collectives(results)
    assert all(result["distributed"] for result in results)
    assert results[0]["barrier_wait_s"] >= 0.4  # replica 0 waited for the late one


def test_one_replica_runs_the_same_code_without_a_process_group(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "SEEDBED_REPLICA_STORE"):
        monkeypatch.delenv(var, raising=False)
    result = _collectives()
    assert not result["distributed"]
    _check_collectives([result])
    params, want = _train(), _reference()
    for mode in ("optimizer", "ddp"):  # both wrappers are no-ops on one replica
        assert all(torch.equal(a, b) for a, b in zip(params[mode], want, strict=True))


# -- replicated training ------------------------------------------------------------------------


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(STEPS, GLOBAL_BATCH, 4, generator=gen), torch.randn(
        STEPS, GLOBAL_BATCH, 2, generator=gen
    )


def _shard(ctx: InputContext):
    """Replica r's equal share of every global batch."""
    xs, ys = _batches()
    share = GLOBAL_BATCH // ctx.num_replicas
    mine = slice(ctx.replica_id * share, (ctx.replica_id + 1) * share)
    for x, y in zip(xs, ys, strict=True):
        yield x[mine], y[mine]


def _train() -> dict[str, list[torch.Tensor]]:
    """Train the same MLP on this replica's shards: with wrap_optimizer, with DDP, and as the
    learners do (``optimizer_step``: averaged gradients, clipped, then the step)."""
    params = {}
    with Replicator() as rep:
        for mode in ("optimizer", "ddp", "clipped"):
            torch.manual_seed(rep.replica_id)  # different starts: wrapping must align them
            model = _model()
            net = rep.wrap_model(model) if mode == "ddp" else model
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
            if mode != "ddp":
                opt = rep.wrap_optimizer(opt)

            def step_fn(ctx, batch, net=net, opt=opt, mode=mode):
                x, y = batch
                loss = F.mse_loss(net(x), y)
                if mode == "clipped":
                    return optimizer_step(net, opt, {"mse": loss}, CLIP)["loss"]
                opt.zero_grad()
                loss.backward()
                opt.step()
                return loss.detach()

            outputs = rep.run(step_fn, _shard)
            assert len(outputs) == STEPS
            params[mode] = [p.detach().clone() for p in model.parameters()]
    return params


def _reference(clip: float | None = None) -> list[torch.Tensor]:
    """One process, whole batches, replica 0's starting weights."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for x, y in zip(*_batches(), strict=True):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            assert norm > clip  # the clip is active
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.distributed
def test_replicated_training_matches_one_process_on_whole_batches(no_leaks):
    replicas = spawn(2, _train)
    for mode in ("optimizer", "ddp", "clipped"):
        want = _reference(CLIP if mode == "clipped" else None)
        first, second = replicas[0][mode], replicas[1][mode]
        for a, b, w in zip(first, second, want, strict=True):
            assert torch.equal(a, b), f"{mode}: replicas differ"
            torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-6)


# -- failures -----------------------------------------------------------------------------------


def _fail(how: str) -> None:
    """Replica 1 fails after one step together; replica 0 then waits for it in a collective."""
    with Replicator() as rep:
        rep.all_reduce(torch.ones(3))
        if rep.replica_id == 1:
            if how == "raise":
                raise ValueError("replica one is broken")
            if how == "exit":
                os._exit(3)
            time.sleep(600)  # "hang": alive but never in the collective
        rep.all_reduce(torch.ones(3))


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raise", r"^replica 1 of 2 failed: ValueError: replica one is broken$"),
        ("exit", r"^replica 1 of 2 failed: died without a result \(exit code 3\)$"),
        ("hang", r"^replica 0 of 2 failed: \w+: .*[Tt]imed out"),  # it waited in a collective
    ],
    ids=["raise", "exit", "hang"],
)
def test_a_failed_replica_stops_the_group_with_its_error(how, message, no_leaks):
    start = time.monotonic()
    with pytest.raises(ReplicaError, match=message) as caught:
        spawn(2, _fail, how, timeout=2.0)
    assert time.monotonic() - start < 45
    assert "\n" not in str(caught.value)
    if how == "raise":
        assert caught.value.replica == 1
        assert "ValueError: replica one is broken" in caught.value.traceback


def test_spawn_refuses_to_nest(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SeedbedError, match="already a replica"):
        spawn(2, _fail, "raise")


# -- examples and the command line --------------------------------------------------------------


def _run(*argv: str) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return finish(proc, timeout=120)


@pytest.mark.distributed
def test_digits_example_learns_on_two_replicas_under_the_cli(no_leaks):
    pytest.importorskip("sklearn", reason="the examples extra: pip install -e '.[examples]'")
    script = "examples/replicate_digits.py"
    code, out, err = _run("-m", "seedbed", "replicate", "-n", "2", script, "--epochs", "3")
    assert code == 0, err[-3000:]
    accuracy = float(re.search(r"test accuracy ([\d.]+)", out).group(1))
    assert accuracy >= 0.9 and "on 2 replica(s)" in out


@pytest.mark.distributed
def test_cli_shows_a_failed_replicas_error_in_one_line(tmp_path, no_leaks):
    script = tmp_path / "broken.py"
    script.write_text(
        "from seedbed.replicate import Replicator\n"
        "rep = Replicator()\n"
        "rep.barrier()\n"
        "if rep.replica_id == 1:\n"
        "    raise KeyError('no such weights')\n"
        "rep.barrier()\n"
    )
    code, _, err = _run("-m", "seedbed", "replicate", "-n", "2", str(script))
    assert code == 2
    assert "seedbed: error: replica 1 of 2 failed: KeyError: 'no such weights'" in err
    assert "raise KeyError('no such weights')" in err  # the replica's traceback
