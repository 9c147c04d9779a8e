"""Vector envs as actors step them: episodes restart on the step they end."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from seedbed.envs import SameStepCartPole, make_vector_env


def _returns(envs, steps: int, policy) -> tuple[list[float], list[int], np.ndarray]:
    """Finished episodes' returns and lengths, and each step's (done, obs) for checks."""
    obs, _ = envs.reset(seed=0)
    ret, length = np.zeros(envs.num_envs), np.zeros(envs.num_envs, int)
    returns, lengths, fresh = [], [], []
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = envs.step(policy(obs))
        done = terminated | truncated
        ret += reward
        length += 1
        returns += ret[done].tolist()
        lengths += length[done].tolist()
        fresh.append(np.abs(obs[done]).max(initial=0.0))
        ret[done], length[done] = 0.0, 0
    return returns, lengths, np.array(fresh)


def test_cartpole_runs_vectorised_and_restarts_on_the_same_step():
    envs = make_vector_env("CartPole-v1", 16, seed=0)
    assert isinstance(envs, SameStepCartPole)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    rng = np.random.default_rng(0)
    returns, lengths, fresh = _returns(envs, 3000, lambda o: rng.integers(0, 2, len(o)))
    assert (fresh <= 0.05).all()  # an ended env's observation already starts the next episode
    assert returns == [float(n) for n in lengths]  # +1 per step, the ending step included
    # Gymnasium's single CartPole under a random policy: the same return, within noise.
    single = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(16)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    reference, _, _ = _returns(single, 3000, lambda o: rng.integers(0, 2, len(o)))
    assert abs(np.mean(returns) - np.mean(reference)) < 2.0, (np.mean(returns), np.mean(reference))


def test_cartpole_is_cut_at_its_time_limit():
    envs = make_vector_env("CartPole-v1", 4, seed=0)
    # Push towards where the pole falls, minding the cart: it balances for good.
    balance = lambda o: (0.1 * o[:, 0] + 0.5 * o[:, 1] + 5 * o[:, 2] + o[:, 3] > 0).astype(int)  # noqa: E731
    obs, _ = envs.reset(seed=0)
    for t in range(1, 501):
        obs, _, terminated, truncated, _ = envs.step(balance(obs))
        assert not terminated.any()
        assert truncated.all() == truncated.any() == (t == 500)
