"""What a replica's step sees: its place among the replicas, and collectives over nested tensors.

Every collective takes a tensor, a Python number or any nesting of dicts, lists and tuples of
them. The leaves of one dtype travel together: they are packed into one flat buffer and sent in
one call, so a dict of twenty small tensors costs one round trip, not twenty. Every replica must
call the same collectives in the same order, with trees of the same structure, dtypes and shapes
(as with MPI or NCCL); a replica that does not come makes the others wait until the timeout.

With one replica there is no process group and no call is made, but the results have the same
types, dtypes and shapes (``all_gather`` stacks one tensor, ``mean`` of integers is a float), so
code written for N replicas runs unchanged on one.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

Op = Literal["sum", "mean", "min", "max"]
_SUMMED = {"sum", "mean"}


def _reduce_op(op: str) -> Any:
    """The torch.distributed op behind one of ours (mean is a sum, divided afterwards)."""
    ops = {"sum": "SUM", "mean": "SUM", "min": "MIN", "max": "MAX"}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    return getattr(dist.ReduceOp, ops[op])


def _split(flat: torch.Tensor, tensors: Sequence[torch.Tensor], shape: Callable) -> list:
    """Cut ``flat`` (its last dimension) back into one tensor per input, shaped by ``shape``."""
    sizes = [shape(t).numel() for t in tensors]
    parts = torch.split(flat, sizes, dim=-1)
    return [p.reshape((*flat.shape[:-1], *shape(t))) for p, t in zip(parts, tensors, strict=True)]


class ReplicaContext:
    """One replica's view of the group: who it is, and the collectives ``step_fn`` calls.

    Attributes:
        replica_id: this replica's index, 0 to ``num_replicas - 1`` (the global rank).
        num_replicas: how many replicas run the same ``step_fn`` (the world size).
        device: where this replica computes; collectives run there (NCCL on CUDA, gloo on CPU).
    """

    def __init__(
        self, replica_id: int, num_replicas: int, device: torch.device, distributed: bool
    ) -> None:
        self.replica_id = replica_id
        self.num_replicas = num_replicas
        self.device = device
        self._distributed = distributed  # a process group exists (also for a group of one)
        self._ddp_params: set[int] = set()  # ids of parameters whose gradients DDP averages

    @property
    def is_primary(self) -> bool:
        """Replica 0: the one that logs, evaluates and writes files."""
        return self.replica_id == 0

    # -- collectives --------------------------------------------------------------------------

    def all_reduce(self, tree: Any, op: Op = "sum") -> Any:
        """Combine each leaf element-wise over replicas; every replica gets the result.

        ``mean`` divides the sum by ``num_replicas``; for integer leaves it is float64.
        """
        red = _reduce_op(op)
        if not self._distributed and op != "mean":
            return self._alone(tree)  # the learner's every step: skip the copies

        def reduce(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            if self._distributed:
                dist.all_reduce(flat, red)
            if op == "mean":
                flat = _divide(flat, self.num_replicas)
            return _split(flat, tensors, lambda t: t.shape)

        return self._per_dtype(tree, reduce)

    def all_gather(self, tree: Any) -> Any:
        """Every replica's leaves, stacked on a new first dimension of size ``num_replicas``.

        A number leaf becomes a list of ``num_replicas`` numbers.
        """

        def gather(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            out = flat.new_empty(self.num_replicas, flat.numel())
            if self._distributed:
                _all_gather_single(out.view(-1), flat)
            else:
                out.copy_(flat)
            return _split(out, tensors, lambda t: t.shape)

        return self._per_dtype(tree, gather)

    def broadcast(self, tree: Any, src: int = 0) -> Any:
        """Replica ``src``'s leaves, on every replica (e.g. to start from the same weights)."""
        if not 0 <= src < self.num_replicas:
            raise ValueError(f"src must be a replica id below {self.num_replicas}, got {src}")
        if not self._distributed:
            return self._alone(tree)

        def send(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            if self._distributed:
                dist.broadcast(flat, src)
            return _split(flat, tensors, lambda t: t.shape)

        return self._per_dtype(tree, send)

    def reduce_scatter(self, tree: Any, op: Op = "sum") -> Any:
        """Reduce each leaf over replicas, then give replica r the r-th slice of its first dim.

        Every leaf's first dimension must divide by ``num_replicas``; a leaf of shape
        ``(N * k, ...)`` comes back as ``(k, ...)``. Number leaves are not allowed.
        """
        red = _reduce_op(op)
        n = self.num_replicas

        def chunk_shape(t: torch.Tensor) -> torch.Size:
            return torch.Size((t.shape[0] // n, *t.shape[1:]))

        def scatter(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            for t in tensors:
                if t.dim() == 0 or t.shape[0] % n:
                    raise ValueError(
                        f"reduce_scatter needs leaves whose first dimension divides by the "
                        f"{n} replicas, got shape {tuple(t.shape)}"
                    )
            # Row r of this matrix holds slice r of every leaf, so one call scatters them all.
            rows = torch.cat([t.reshape(n, -1) for t in tensors], dim=1)
            out = rows.new_empty(rows.shape[1])
            if self._distributed:
                _reduce_scatter_single(out, rows.reshape(-1), red)
            else:
                out.copy_(rows[0])
            if op == "mean":
                out = _divide(out, n)
            return _split(out, tensors, chunk_shape)

        return self._per_dtype(tree, scatter, numbers_allowed=False)

    def barrier(self) -> None:
        """Wait until every replica gets here (e.g. before reading a file replica 0 wrote)."""
        if not self._distributed:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def reduce_outputs(self, outputs: Sequence[Any], op: Op = "mean") -> Any:
        """One value per leaf from a run's outputs, over all steps of all replicas, to log.

        ``outputs`` is what ``Replicator.run`` returned: a list of same-shaped trees, one per
        step. ``mean`` weighs every step of every replica alike.
        """
        _reduce_op(op)
        if not outputs:
            raise ValueError("reduce_outputs needs at least one step's outputs on every replica")
        steps = [pytree.tree_flatten(out) for out in outputs]
        spec = steps[0][1]
        firsts = steps[0][0]
        columns = []
        for leaves in zip(*(leaves for leaves, _ in steps), strict=True):
            column = torch.stack([torch.as_tensor(x).detach().to(self.device) for x in leaves])
            if op in _SUMMED:
                column = column.double() if op == "mean" else column
                columns.append(column.sum(0))
            else:
                columns.append(column.amin(0) if op == "min" else column.amax(0))
        if op == "mean":
            totals, count = self.all_reduce((columns, float(len(outputs))), "sum")
            columns = [t / count for t in totals]
        else:
            columns = self.all_reduce(columns, op)
        values = []
        for first, value in zip(firsts, columns, strict=True):
            if isinstance(first, torch.Tensor):
                dtype = first.dtype if first.is_floating_point() or op != "mean" else value.dtype
                values.append(value.to(first.device, dtype))
            else:
                values.append(value.item() if value.dim() == 0 else value.tolist())
        return pytree.tree_unflatten(values, spec)

    # -- gradients ----------------------------------------------------------------------------

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make ``optimizer.step()`` average its parameters' gradients over replicas first.

        Returns the same optimizer (so LR schedulers and checkpoints work on it as before),
        after copying replica 0's parameter values to every replica, so that identical
        gradients then keep the replicas identical. Every replica must call it, in the same
        order. A parameter with no gradient on some replicas counts as zero there, as in DDP;
        one with no gradient anywhere stays ``None``. Parameters of a model given to
        ``wrap_model`` are skipped: DDP has averaged them already. With one replica the
        optimizer is returned untouched.

        Anything done to the gradients between ``backward`` and ``step`` (clipping, a
        GradScaler's inf check) sees this replica's own gradients, not the average, unless
        ``optimizer.sync_gradients()`` is called first: it averages them at once, and the next
        ``step()`` then does not average again. (``seedbed.agents.base.optimizer_step`` does
        this, so learners clip the averaged gradients, as one process would.)
        """
        if self.num_replicas == 1 or getattr(optimizer, "_seedbed_replicated", False):
            return optimizer
        params = self._params(optimizer)
        synced = self.broadcast([p.detach() for p in params], src=0)
        with torch.no_grad():
            for p, value in zip(params, synced, strict=True):
                p.copy_(value)

        synced = False  # sync_gradients() ran since the last step

        def sync_gradients() -> None:
            nonlocal synced
            self.average_gradients(self._params(optimizer))
            synced = True

        def average_gradients(opt: Any, args: tuple, kwargs: dict) -> None:
            nonlocal synced
            closure = args[1] if len(args) > 1 else kwargs.get("closure")  # args[0] is opt
            if closure is not None:
                raise NotImplementedError(
                    "wrap_optimizer does not average gradients computed inside a closure "
                    "(LBFGS); use wrap_model (DDP) for such optimizers"
                )
            if not synced:
                self.average_gradients(self._params(opt))
            synced = False

        optimizer.register_step_pre_hook(average_gradients)
        optimizer.sync_gradients = sync_gradients  # type: ignore[attr-defined]
        optimizer._seedbed_replicated = True  # type: ignore[attr-defined]
        return optimizer

    def average_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its mean over replicas, in a few collectives."""
        if not params:
            return
        for p in params:
            if p.grad is not None and p.grad.is_sparse:
                raise TypeError("sparse gradients are not supported; use wrap_model (DDP)")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32)
        sums, counts = self.all_reduce((grads, present), "sum")
        with torch.no_grad():
            for p, total, count in zip(params, sums, counts.tolist(), strict=True):
                if count == 0:
                    continue
                mean = total.div_(self.num_replicas)
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on this replica's device, in DDP when there are several replicas.

        DDP copies replica 0's weights and buffers to all at the start and averages gradients
        during ``backward`` (overlapping communication with compute): the faster choice for one
        large model trained by one loss. ``wrap_optimizer`` is the simpler one for several
        models or losses (a GAN); both can be used together. With one replica the model itself
        is returned.
        """
        model = model.to(self.device)
        if not self._distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids)
        self._ddp_params.update(id(p) for p in model.parameters())
        return wrapped

    # -- helpers ------------------------------------------------------------------------------

    def _params(self, optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
        """The optimizer's parameters whose gradients are ours to average (DDP does the rest)."""
        return [
            p
            for group in optimizer.param_groups
            for p in group["params"]
            if id(p) not in self._ddp_params
        ]

    def _alone(self, tree: Any) -> Any:
        """What a sum, min, max or broadcast gives a replica with no group: its own leaves
        (tensors detached), as ``_per_dtype`` would return them, without the copies."""

        def leaf(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return x.detach()
            if x is None or isinstance(x, numbers.Number):
                return x
            raise TypeError(f"collectives take tensors and numbers, got {type(x).__name__}")

        return pytree.tree_map(leaf, tree)

    def _per_dtype(self, tree: Any, fn: Callable, numbers_allowed: bool = True) -> Any:
        """Apply ``fn`` to the tree's leaves of each dtype at once, then rebuild the tree.

        Leaves are detached and moved to this replica's device for the call; results go back to
        each leaf's own device, and number leaves come back as numbers. ``None`` leaves pass.
        """
        leaves, spec = pytree.tree_flatten(tree)
        tensors: list[torch.Tensor | None] = []
        for leaf in leaves:
            if leaf is None:
                tensors.append(None)
            elif isinstance(leaf, torch.Tensor):
                tensors.append(leaf.detach().to(self.device))
            elif isinstance(leaf, numbers.Number) and numbers_allowed:
                dtype = torch.float64 if isinstance(leaf, float) else None
                tensors.append(torch.tensor(leaf, dtype=dtype, device=self.device))
            else:
                raise TypeError(f"collectives take tensors and numbers, got {type(leaf).__name__}")
        groups: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            if t is not None:
                groups.setdefault(t.dtype, []).append(i)
        results: list[Any] = list(leaves)
        for index in groups.values():
            outs = fn([tensors[i] for i in index])
            for i, out in zip(index, outs, strict=True):
                leaf = leaves[i]
                if isinstance(leaf, torch.Tensor):
                    results[i] = out.to(leaf.device)
                else:
                    results[i] = out.item() if out.dim() == 0 else out.tolist()
        return pytree.tree_unflatten(results, spec)


def _divide(x: torch.Tensor, n: int) -> torch.Tensor:
    """A sum turned mean; integers become float64, which holds any count exactly."""
    return x / n if x.is_floating_point() else x.double() / n


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor) -> None:
    """``all_gather_single`` (torch 2.13+), or its older name."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def _reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, op: Any) -> None:
    """``reduce_scatter_single`` (torch 2.13+), or its older name."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, op)
