"""Prioritized replay: sum-tree math against counts and sums, windows, priorities, rate limits."""

from __future__ import annotations

import inspect
import math
import threading
import time

import numpy as np
import pytest
import torch

from seedbed.replay import PrioritizedReplay, SumTree, UnrollQueue
from seedbed.types import Buffer, Unrolls


def chi2_critical_999(dof: int) -> float:
    """The p = 0.001 critical value of chi-square (Wilson-Hilferty; within 1% for dof >= 10)."""
    z = 3.090232  # the standard normal's 0.999 quantile
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def draw_counts(tree: SumTree, batches: int, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    leaves = np.concatenate([tree.sample(batch, rng) for _ in range(batches)])
    return np.bincount(leaves, minlength=tree.size)


def test_critical_value_matches_the_table():
    assert chi2_critical_999(10) == pytest.approx(29.588, rel=1e-2)
    assert chi2_critical_999(40) == pytest.approx(73.402, rel=1e-2)


def test_sum_tree_draws_leaves_in_proportion_to_their_values():
    rng = np.random.default_rng(0)
    values = rng.uniform(0.2, 5.0, size=50)  # 50 leaves: padded to 64 internally
    values[::7] = 0.0
    live = values > 0
    probabilities = values[live] / values[live].sum()
    dof = int(live.sum()) - 1
    tree = SumTree(50)
    tree.update(np.arange(50), values)

    # One draw per call: independent draws, for which the statistic is chi-square distributed.
    counts = draw_counts(tree, 30_000, 1, seed=1)
    assert counts[~live].sum() == 0
    assert chi2(counts[live], 30_000 * probabilities) < chi2_critical_999(dof)
    # The test can fail: against the wrong frequencies the statistic is far above the bound.
    wrong = rng.permutation(probabilities)
    assert chi2(counts[live], 30_000 * wrong) > 10 * chi2_critical_999(dof)

    # Stratified batches, as replay draws them: 200 batches of 1000. In each batch a leaf's count
    # is off its expectation by less than 2 (only the strata at the two ends of its slice of the
    # total are uncertain), so by Hoeffding |error| >= 150 over 200 batches has p < 2e-6.
    counts = draw_counts(tree, 200, 1000, seed=2)
    assert counts[~live].sum() == 0
    assert np.abs(counts[live] - 200_000 * probabilities).max() < 150
    assert chi2(counts[live], 200_000 * probabilities) < chi2_critical_999(dof)


def test_sum_tree_never_draws_an_empty_leaf_at_float_edges():
    rng = np.random.default_rng(2)
    for size in (1, 2, 3, 17, 64):
        tree = SumTree(size)
        for _ in range(50):
            values = 10.0 ** rng.uniform(-300, 300, size) * (rng.random(size) < 0.3)
            if not values.any():
                values[rng.integers(size)] = 1e-300
            tree.update(np.arange(size), values)
            leaves = tree.sample(257, rng)
            assert (values[leaves] > 0).all()
    tree.update(np.arange(64), np.zeros(64))
    with pytest.raises(ValueError, match="total is 0"):
        tree.sample(4, rng)


def test_sum_tree_updates_are_exact():
    rng = np.random.default_rng(3)
    size = 37
    tree = SumTree(size)
    leaves = np.zeros(size)
    for _ in range(2000):
        idx = rng.integers(0, size, rng.integers(1, 12))  # duplicates are common
        values = rng.exponential(size=idx.size) * (rng.random(idx.size) < 0.8)
        tree.update(idx, values)
        for i, v in zip(idx, values, strict=True):  # the last value wins
            leaves[i] = v
    np.testing.assert_array_equal(tree.get(np.arange(size)), leaves)

    nodes = tree._nodes  # the invariant itself: every parent is exactly left + right
    half = len(nodes) // 2
    np.testing.assert_array_equal(nodes[1:half], nodes[2::2] + nodes[3::2])
    # The root equals a fresh pairwise sum of the leaves, in the tree's order.
    level = np.concatenate([leaves, np.zeros(half - size)])
    while level.size > 1:
        level = level[0::2] + level[1::2]
    assert tree.total == level[0]

    integers = SumTree(size)  # small integers add exactly in any order
    for _ in range(500):
        idx = rng.integers(0, size, 5)
        integers.update(idx, rng.integers(0, 1000, 5).astype(np.float64))
    assert integers.total == math.fsum(integers.get(np.arange(size)))

    tree.update(np.array([3, 3, 3]), np.array([1.0, 2.0, 5.0]))
    assert tree[np.array([3])][0] == 5.0


def make_unrolls(first: int, count: int, steps: int, *, state: bool = False) -> Unrolls:
    """``count`` unrolls numbered from ``first``: obs[t, b] = (first + b) * 1000 + t."""
    ids = torch.arange(first, first + count)
    t = torch.arange(steps)[:, None]
    obs = (ids[None, :] * 1000 + t).to(torch.float32)
    return Unrolls(
        {
            "obs": obs[:, :, None].expand(steps, count, 3).clone(),
            "frame": ((ids[None, :] * 10 + t) % 256)
            .to(torch.uint8)[:, :, None, None]
            .repeat(1, 1, 2, 2),
            "action": ids[None, :] + t,
            "done": (t + ids[None, :]) % 2 == 0,
        },
        (ids[:, None].float().repeat(1, 4),) if state else (),
        ids.clone(),
    )


def replay(**overrides) -> PrioritizedReplay:
    settings = dict(
        capacity=16,
        positions=1,
        window=4,
        alpha=1.0,
        beta=1.0,
        min_fill=1,
        samples_per_insert=None,
        slack=0,
    )
    settings.update(overrides)
    return PrioritizedReplay(**settings)


def counts(store: PrioritizedReplay) -> dict[str, int]:
    """The replay's item counters, without the bytes of its storage."""
    return {k: v for k, v in store.stats().items() if k != "bytes"}


def test_items_are_the_right_windows_and_are_copies():
    store = replay(capacity=24, positions=3, window=4)
    store.put(make_unrolls(0, 5, 6))
    store.put(make_unrolls(5, 3, 6))
    assert len(store) == 24
    batch = store.get(256)
    ids = batch.policy_version
    pos = batch.replay.indices % 3
    assert (batch.replay.indices // 3 == ids).all()  # rows 0..7 hold unrolls 0..7
    expected_t = pos[None, :] + torch.arange(4)[:, None]  # [window, B]
    obs = ids[None, :] * 1000 + expected_t
    assert batch.steps["obs"].shape == (4, 256, 3)
    assert (batch.steps["obs"] == obs[:, :, None]).all()
    assert batch.steps["frame"].dtype == torch.uint8 and batch.steps["frame"].shape == (
        4,
        256,
        2,
        2,
    )
    assert (batch.steps["frame"] == ((ids * 10 + expected_t) % 256)[:, :, None, None]).all()
    assert (batch.steps["action"] == ids[None, :] + expected_t).all()
    assert batch.steps["done"].dtype == torch.bool
    assert batch.replay.weights.dtype == torch.float32 and (batch.replay.weights == 1).all()
    assert (batch.replay.generations == 1).all()

    store.put(make_unrolls(100, 8, 6))  # overwrites every row: the batch must not change
    assert (batch.steps["obs"] == obs[:, :, None]).all()
    assert (batch.policy_version == ids).all()


def test_stats_count_the_bytes_of_the_whole_ring_from_the_first_put():
    store = replay(capacity=24, positions=3, window=4)
    assert store.stats()["bytes"] == 0
    store.put(make_unrolls(0, 1, 6, state=False))
    rows, steps = 8, 6
    # per step: obs 3 float32, frame 2x2 uint8, action int64, done bool; per row: its version
    per_row = steps * (3 * 4 + 4 + 8 + 1) + 8
    assert store.stats()["bytes"] == store.nbytes == rows * per_row
    recurrent = replay(capacity=8, positions=1, window=4)
    recurrent.put(make_unrolls(0, 1, 6, state=True))
    assert recurrent.nbytes == 8 * (per_row + 4 * 4)  # and each row's float32 state of 4


def test_ring_overwrites_the_oldest_rows():
    store = replay(capacity=4)
    store.put(make_unrolls(0, 3, 5))
    store.put(make_unrolls(3, 3, 5))
    assert len(store) == 4 and counts(store) == {"items": 4, "inserted": 6, "sampled": 0}
    batch = store.get(64)
    assert set(batch.policy_version.tolist()) == {2, 3, 4, 5}
    versions, generations = batch.policy_version.tolist(), batch.replay.generations.tolist()
    generation = dict(zip(versions, generations, strict=True))
    assert generation == {2: 1, 3: 1, 4: 2, 5: 2}

    store.put(make_unrolls(10, 6, 5))  # larger than the ring: its newest four stay
    assert set(store.get(64).policy_version.tolist()) == {12, 13, 14, 15}


def test_recurrent_state_comes_with_its_row():
    store = replay(capacity=8)
    store.put(make_unrolls(0, 8, 4, state=True))
    batch = store.get(32)
    (state,) = batch.initial_state
    assert state.shape == (32, 4)
    assert (state == batch.policy_version[:, None].float()).all()


def test_learned_priorities_change_what_is_drawn():
    store = replay(capacity=20)
    store.put(make_unrolls(0, 20, 4))
    batch = store.get(400)  # stratified over equal priorities: every item, 20 times
    assert torch.bincount(batch.replay.indices, minlength=20).tolist() == [20] * 20
    batch.replay.priorities = torch.where(batch.replay.indices == 5, 1000.0, 1.0).requires_grad_()
    store.learned(batch)
    counts = torch.bincount(store.get(2000).replay.indices, minlength=20)
    assert counts[5] > 0.9 * 2000  # p = 1000 / 1019

    store.put(make_unrolls(20, 1, 4))  # new items get the largest priority so far
    counts = torch.bincount(store.get(2000).replay.indices, minlength=20)
    assert counts[0] > 0.45 * 2000 and counts[5] > 0.45 * 2000

    store.learned(store.get(8))  # no priorities set: nothing changes
    store.learned(make_unrolls(0, 2, 4))  # not from replay at all


def test_priorities_for_overwritten_rows_are_ignored():
    store = replay(capacity=2)
    store.put(make_unrolls(0, 2, 4))
    batch = store.get(64)
    batch.replay.priorities = torch.full((64,), 1000.0)
    store.put(make_unrolls(2, 1, 4))  # overwrites row 0 (item 0) only
    store.learned(batch)
    counts = torch.bincount(store.get(1000).replay.indices, minlength=2)
    assert counts[1] > 0.99 * 1000  # item 1: 1000; item 0 kept its new priority, 1


def test_importance_weights_are_normalised_n_p_to_the_minus_beta():
    alpha, beta = 0.5, 0.4
    store = replay(capacity=4, alpha=alpha, beta=beta)
    store.put(make_unrolls(0, 4, 4))
    batch = store.get(8)
    priorities = torch.tensor([1.0, 4.0, 9.0, 16.0], dtype=torch.float64)
    batch.replay.priorities = priorities[batch.replay.indices]
    store.learned(batch)

    batch = store.get(256)
    assert set(batch.replay.indices.tolist()) == {0, 1, 2, 3}
    values = (priorities + 1e-6) ** alpha
    weights = (4 * values / values.sum()) ** -beta
    weights /= weights.max()
    torch.testing.assert_close(batch.replay.weights, weights[batch.replay.indices].float())
    assert batch.replay.weights.max() == 1.0


def test_get_waits_for_min_fill():
    store = replay(capacity=8, min_fill=4)
    store.put(make_unrolls(0, 3, 4))
    start = time.monotonic()
    assert store.get(2, timeout=0.05) is None
    assert time.monotonic() - start >= 0.05
    store.put(make_unrolls(3, 1, 4))
    assert store.get(2, timeout=0.05) is not None


def test_put_waits_while_sampling_is_behind():
    store = replay(capacity=100, min_fill=4, samples_per_insert=1.0, slack=2)
    assert store.put(make_unrolls(0, 4, 4), timeout=0)  # before min_fill: always
    assert store.get(1, timeout=0.01) is None  # owed 1 * (4 - 4) - 0 = 0 < 1
    assert store.put(make_unrolls(4, 4, 4), timeout=0)  # owed 0 <= slack
    assert not store.put(make_unrolls(8, 1, 4), timeout=0.05)  # owed 4 > slack
    assert store.get(2) is not None  # owed 2
    assert store.put(make_unrolls(8, 1, 4), timeout=0.05)
    assert counts(store) == {"items": 9, "inserted": 9, "sampled": 2}


def test_no_rate_limit_without_samples_per_insert():
    store = replay(capacity=8, min_fill=2)
    for i in range(20):
        assert store.put(make_unrolls(i, 1, 4), timeout=0)
    for _ in range(20):
        assert store.get(8, timeout=0) is not None


def test_rate_limiter_keeps_sampling_near_the_ratio_under_load():
    ratio, min_fill, slack, batch_size, per_put = 2.0, 8, 8, 4, 2 * 2
    store = replay(
        capacity=64, positions=2, window=3, min_fill=min_fill, samples_per_insert=ratio, slack=slack
    )
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        i = 0
        try:
            while not stop.is_set():
                i += store.put(make_unrolls(i, 2, 4), timeout=0.05)
        except BaseException as error:  # surfaces in the main thread's assert
            errors.append(error)

    def consume() -> None:
        try:
            while not stop.is_set():
                batch = store.get(batch_size, timeout=0.05)
                if batch is not None:
                    batch.replay.priorities = torch.rand(batch_size)
                    store.learned(batch)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 1.0
    snapshots = []
    while time.monotonic() < deadline:
        snapshots.append(store.stats())
        time.sleep(0.001)
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    assert not errors and not any(thread.is_alive() for thread in threads)

    for s in snapshots:
        owed = ratio * (s["inserted"] - min_fill) - s["sampled"]
        assert owed >= 0 or s["sampled"] == 0  # get takes only what is owed
        assert owed <= slack + ratio * per_put  # put goes only while owed <= slack
    final = store.stats()
    assert final["sampled"] >= 100 and final["inserted"] > min_fill


def test_close_wakes_a_waiting_get_and_put():
    store = replay(capacity=100, min_fill=4, samples_per_insert=1.0, slack=2)
    store.put(make_unrolls(0, 4, 4))
    store.put(make_unrolls(4, 4, 4))  # owed 4: puts wait (> slack), and so does a get of 50
    results = {}
    putter = threading.Thread(
        target=lambda: results.update(put=store.put(make_unrolls(8, 1, 4), timeout=10))
    )
    getter = threading.Thread(target=lambda: results.update(get=store.get(50, timeout=10)))
    putter.start()
    getter.start()
    time.sleep(0.1)
    assert putter.is_alive() and getter.is_alive()
    start = time.monotonic()
    store.close()
    putter.join(timeout=5)
    getter.join(timeout=5)
    assert time.monotonic() - start < 1
    assert results == {"put": False, "get": None}
    assert store.get(1, timeout=10) is None
    assert store.put(make_unrolls(20, 1, 4), timeout=10) is False


def test_close_wakes_a_get_waiting_for_min_fill():
    store = replay(capacity=8, min_fill=4)
    results = {}
    getter = threading.Thread(target=lambda: results.update(get=store.get(2, timeout=10)))
    getter.start()
    time.sleep(0.05)
    store.close()
    getter.join(timeout=5)
    assert not getter.is_alive() and results["get"] is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"slack": -1},
        {"alpha": -0.1},
        {"beta": -0.1},
        {"capacity": 2, "positions": 3},
        {"min_fill": 17},
        {"positions": 0},
        {"window": 0},
        {"samples_per_insert": 0.0},
        {"samples_per_insert": -1.0},
    ],
)
def test_bad_settings_are_refused(overrides):
    with pytest.raises(ValueError):
        replay(**overrides)


def test_unrolls_that_do_not_fit_the_items_are_refused():
    with pytest.raises(ValueError, match="positions - 1 \\+ window"):
        replay(positions=2, window=4).put(make_unrolls(0, 1, 4))
    with pytest.raises(ValueError, match="positions=1"):
        replay(positions=2, window=3).put(make_unrolls(0, 1, 4, state=True))
    store = replay()
    store.put(make_unrolls(0, 1, 4))
    with pytest.raises(ValueError, match="layout changed"):
        store.put(make_unrolls(1, 1, 5))


def test_the_fifo_accepts_learned_and_has_no_stats():
    queue = UnrollQueue(4)
    queue.put(make_unrolls(0, 2, 3))
    batch = queue.get(2)
    queue.learned(batch)
    assert len(queue) == 0 and queue.stats() is None


def test_lockstep_holds_acting_while_a_batch_waits_or_is_learned():
    queue = UnrollQueue(8)
    assert queue.may_act(0.0)  # not in lockstep: never held
    queue.put(make_unrolls(0, 4, 3))
    assert queue.may_act(0.0)
    queue.hold_acting(4)
    assert not queue.may_act(0.0)  # a whole batch waits
    batch = queue.get(4)
    assert not queue.may_act(0.0)  # and is being learned from
    queue.put(make_unrolls(4, 3, 3))  # fewer than a batch: the learner needs more, never held
    queue.learned(batch)
    assert queue.may_act(0.0)

    # A waiter wakes when the learner is done, not at its timeout.
    queue.put(make_unrolls(7, 1, 3))
    batch = queue.get(4)
    woke: list[float] = []

    def wait() -> None:
        start = time.perf_counter()
        assert queue.may_act(30.0)
        woke.append(time.perf_counter() - start)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    assert not woke  # still held
    queue.learned(batch)
    waiter.join(5.0)
    assert woke and woke[0] < 5.0
    queue.put(make_unrolls(8, 4, 3))
    queue.close()
    assert not queue.may_act(0.0)  # closed: nothing to act for


@pytest.mark.parametrize("store", [UnrollQueue, PrioritizedReplay])
def test_both_stores_have_the_buffer_methods(store):
    # No type checker runs here: check by hand that each is a Buffer, as the runtime types it.
    methods = [name for name, value in vars(Buffer).items() if inspect.isfunction(value)]
    methods = [name for name in methods if not name.startswith("_")]
    assert methods == ["put", "get", "learned", "stats", "close"]
    for name in methods:
        want = list(inspect.signature(getattr(Buffer, name)).parameters)
        assert list(inspect.signature(getattr(store, name)).parameters) == want, name


def test_non_finite_priorities_leave_their_items_as_they_were():
    store = replay(capacity=4)
    store.put(make_unrolls(0, 4, 4))
    batch = store.get(4)
    batch.replay.priorities = torch.tensor([float("nan"), float("inf"), 3.0, 1.0])
    store.learned(batch)  # a learner that skipped a non-finite step: no traceback
    drawn = torch.bincount(store.get(4000).replay.indices, minlength=4).float() / 4000
    # Items 0 and 1 keep the first priority (1), items 2 and 3 take theirs: 1 : 1 : 3 : 1.
    assert torch.allclose(drawn, torch.tensor([1.0, 1.0, 3.0, 1.0]) / 6, atol=0.03), drawn
    batch.replay.priorities = torch.tensor([-1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=">= 0"):
        store.learned(batch)
