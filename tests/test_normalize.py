"""Observation normalization and PopArt: their statistics against plain numpy, merged over real
gloo replicas, carried by policy broadcasts, and restored from checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedbed.nets import make_actor_critic
from seedbed.normalize import ObsNormalizer, PopArtValue
from seedbed.quantize import decode_policy, encode_policy
from seedbed.replicate import Replicator, replica_context
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import load_checkpoint
from seedbed.runtime.train import train
from seedbed.types import EnvSpec
from tests.conftest import tiny_settings


def test_observation_statistics_are_those_of_all_observations():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, [0.1, 2.0, 50.0], (n, 3)) for n in (7, 1, 40, 13)]
    norm = ObsNormalizer((3,))
    for b in batches:
        norm.update(torch.tensor(b, dtype=torch.float32))
    every = np.concatenate(batches).astype(np.float32)
    assert float(norm.count) == len(every)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-4)
    out = norm(torch.tensor(every))
    np.testing.assert_allclose(out.mean(0).numpy(), 0.0, atol=1e-3)
    np.testing.assert_allclose(out.std(0).numpy(), 1.0, atol=0.05)
    far = torch.tensor([[1e6, -1e6, 3.0]])
    assert norm(far).tolist()[0][:2] == [5.0, -5.0]  # clipped


@pytest.mark.parametrize("shape", [(2, 8, 8), (4, 21, 21)])
def test_frame_statistics_and_outputs_are_exact_across_chunks(shape):
    # (2, 8, 8): 258 rows a chunk, the most whose sums of 255 ** 2 float32 holds exactly;
    # (4, 21, 21): chunks of 74 rows, which fit the cache. 600 rows cross chunk edges either way.
    rng = np.random.default_rng(1)
    norm = ObsNormalizer(shape)
    batches = [rng.integers(0, 256, (n, *shape), dtype=np.uint8) for n in (600, 37)]
    for b in batches:
        b[:, 0, 0, 0] = 255  # the largest sum of squares there is
        b[:, 0, 0, 1] = 7  # a constant pixel: variance exactly 0
    for b in batches:
        norm.update(torch.from_numpy(b))
    every = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-6, atol=1e-9)
    assert float(norm.var[0, 0, 1]) == 0.0 and float(norm.var[0, 0, 0]) == 0.0
    frames = torch.from_numpy(batches[0])
    want = (frames.float() - norm.mean) / torch.sqrt(norm.var + norm.eps)
    want = want.clamp(-norm.clip, norm.clip)
    torch.testing.assert_close(norm(frames), want, rtol=1e-6, atol=1e-5)
    half = norm(frames.view(20, 30, *shape), torch.bfloat16)  # any leading dims, any dtype
    assert half.dtype == torch.bfloat16 and half.shape == (20, 30, *shape)
    torch.testing.assert_close(half.view_as(want), want.bfloat16())


def test_popart_preserves_outputs_and_follows_the_targets():
    torch.manual_seed(0)
    head = PopArtValue(4, beta=0.5)
    x = torch.randn(20, 4)
    targets = 100.0 + 30.0 * torch.randn(64)
    mu = nu = None
    for _ in range(5):
        before = head(x)
        old_mu, old_nu = float(head.mu), float(head.nu)
        head.update(targets)
        torch.testing.assert_close(head(x), before, rtol=1e-5, atol=1e-3)  # outputs preserved
        mu = old_mu + 0.5 * (float(targets.mean()) - old_mu)  # the paper's moving averages
        nu = old_nu + 0.5 * (float(targets.pow(2).mean()) - old_nu)
        assert float(head.mu) == pytest.approx(mu, rel=1e-5)
        assert float(head.nu) == pytest.approx(nu, rel=1e-5)
    assert float(head.sigma) == pytest.approx((nu - mu**2) ** 0.5, rel=1e-4)


def _update_a_shard(rows: torch.Tensor) -> dict[str, list]:
    with Replicator(device="cpu") as rep:
        assert replica_context() is rep
        obs, pop = ObsNormalizer((2,)), PopArtValue(3, beta=0.1)
        torch.manual_seed(0)  # the same head on both replicas
        pop.reset_parameters()
        mine = rows[rep.replica_id :: rep.num_replicas]
        sum_over = lambda ts: replica_context().all_reduce(ts, "sum")  # noqa: E731
        obs.update(mine, sum_over)
        pop.update(mine[:, 0], sum_over)
        return {k: v.tolist() for k, v in {**obs.state_dict(), **pop.state_dict()}.items()}


@pytest.mark.distributed
def test_statistics_merge_over_two_replicas_as_over_one_batch():
    rows = torch.randn(9, 2) * torch.tensor([1.0, 10.0]) + 4.0  # 5 rows on one, 4 on the other
    merged = Replicator.spawn(2, _update_a_shard, rows)
    assert merged[0] == merged[1]
    alone = ObsNormalizer((2,))
    alone.update(rows)
    assert merged[0]["count"] == 9
    np.testing.assert_allclose(merged[0]["mean"], alone.mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(merged[0]["var"], alone.var.numpy(), rtol=1e-5)
    pop = PopArtValue(3, beta=0.1)
    pop.update(rows[:, 0])
    assert merged[0]["mu"] == pytest.approx(float(pop.mu), rel=1e-6)
    assert merged[0]["nu"] == pytest.approx(float(pop.nu), rel=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_policy_broadcasts_carry_the_statistics(precision):
    spec = EnvSpec("test", (3,), "float32", 2)
    net = make_actor_critic(spec, (256, 256), None, normalize_obs=True)
    net.obs_norm.update(torch.randn(50, 3) * 100.0 + 7.0)
    template = make_actor_critic(spec, (256, 256), None, normalize_obs=True)
    actor, _ = decode_policy(encode_policy(net, precision, 3), template)
    want = net.obs_norm.mean
    torch.testing.assert_close(actor.obs_norm.mean, want, rtol=1e-3, atol=0.0)
    obs = torch.randn(1, 5, 3) * 100.0 + 7.0
    args = (obs, torch.zeros(1, 5, dtype=torch.int64), torch.zeros(1, 5), torch.zeros(1, 5) > 0, ())
    logits, _, _ = actor(*args, values=False)
    expected, _, _ = net(*args, values=False)
    torch.testing.assert_close(logits, expected, atol=0.05, rtol=0.05)


def _statistics(checkpoint: str) -> dict[str, float]:
    network = load_checkpoint(checkpoint)["agent"]["network"]
    return {k: network[k].double().sum().item() for k in ("obs_norm.count", "value.mu")}


@pytest.mark.distributed
def test_a_replicated_run_counts_every_observation_and_resumes_its_statistics(tmp_path, no_leaks):
    """Each learner step takes batch x unroll observations over both replicas: a count of all
    of them is merged, and a resumed run goes on counting from the checkpoint's."""
    run = tmp_path / "run"
    settings = {"agent": "ppo", "normalize_obs": True, "popart": True, "minibatches": 2}
    settings |= {"learner_replicas": 2, "batch": 4, "unroll": 8}
    first = train(resolve([tiny_settings(run, total_frames=3000, **settings)]))
    assert first["replicas_in_sync"] is True
    stats = _statistics(first["checkpoint"])
    assert stats["obs_norm.count"] == first["learner_steps"] * 4 * 8
    assert stats["value.mu"] != 0.0  # PopArt's statistics moved
    second = train(resolve([tiny_settings(run, total_frames=6000, resume=True, **settings)]))
    assert second["replicas_in_sync"] is True and second["learner_steps"] > first["learner_steps"]
    assert _statistics(second["checkpoint"])["obs_norm.count"] == second["learner_steps"] * 4 * 8


def test_observations_holding_nan_or_inf_are_left_out_of_the_statistics():
    clean = torch.randn(6, 3)
    bad = torch.tensor([[float("nan"), 0.0, 0.0], [0.0, float("inf"), 1.0]])
    poisoned, reference = ObsNormalizer((3,)), ObsNormalizer((3,))
    poisoned.update(torch.cat([clean[:3], bad, clean[3:]]))
    reference.update(clean)
    for name in ("count", "mean", "var"):
        assert torch.equal(getattr(poisoned, name), getattr(reference, name)), name
    poisoned.update(bad)  # nothing finite at all: nothing changes
    assert torch.equal(poisoned.mean, reference.mean) and poisoned.count == 6


def test_popart_leaves_out_targets_that_are_not_finite():
    torch.manual_seed(0)
    poisoned, reference = PopArtValue(4), PopArtValue(4)
    reference.load_state_dict(poisoned.state_dict())
    targets = torch.randn(8) * 10
    poisoned.update(torch.cat([targets, torch.tensor([float("nan"), float("inf")])]))
    reference.update(targets)
    for key, value in reference.state_dict().items():
        assert torch.equal(poisoned.state_dict()[key], value), key
    assert all(v.isfinite().all() for v in poisoned.state_dict().values())
