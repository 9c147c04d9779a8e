"""``check_step`` against a plain loop over the envs: the same rows refused, for any mix of
fine and bad values, so its whole-array shortcut for a step with nothing to refuse never lets
one through."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seedbed.transport.checks import MAX_ABS_REWARD, check_step

NUM_ACTIONS = 4
FLOATS = st.one_of(
    st.floats(-10, 10, width=32),
    st.sampled_from([math.nan, math.inf, -math.inf, 3e38, -2e30, 1e30, 0.0]),
)


def refused_by_loop(obs, reward, acted, num_actions):
    """Env i is refused where any value it sent is one no env or policy gives."""
    rows = []
    for i in range(len(reward)):
        bad = not abs(float(reward[i])) <= MAX_ABS_REWARD
        for array in [obs, *(acted or {}).values()]:
            if array.dtype.kind == "f":
                bad |= not all(math.isfinite(float(x)) for x in array[i].reshape(-1))
        if acted is not None and num_actions and "action" in acted:
            bad |= any(not 0 <= int(a) < num_actions for a in acted["action"][i].reshape(-1))
        rows.append(bad)
    return rows


@st.composite
def steps(draw):
    k = draw(st.integers(1, 6))
    uint8 = draw(st.booleans())
    if uint8:
        obs = np.array(draw(st.lists(st.integers(0, 255), min_size=k * 3, max_size=k * 3)))
        obs = obs.astype(np.uint8).reshape(k, 3)
    else:
        obs = np.array(draw(st.lists(FLOATS, min_size=k * 3, max_size=k * 3)), np.float32)
        obs = obs.reshape(k, 3)
    reward = np.array(draw(st.lists(FLOATS, min_size=k, max_size=k)), np.float32)
    acted = None
    if draw(st.booleans()):
        action = draw(st.lists(st.integers(-2, NUM_ACTIONS + 1), min_size=k, max_size=k))
        logits = draw(st.lists(FLOATS, min_size=k * 2, max_size=k * 2))
        acted = {
            "action": np.array(action, np.int64),
            "logits": np.array(logits, np.float32).reshape(k, 2),
        }
    return obs, reward, acted


@settings(max_examples=300, deadline=None)
@given(steps(), st.sampled_from([0, NUM_ACTIONS]))
def test_check_step_refuses_the_rows_a_plain_loop_refuses(step, num_actions):
    obs, reward, acted = step
    bad, why = check_step(obs, reward, acted, num_actions)
    expected = refused_by_loop(obs, reward, acted, num_actions)
    assert bad.tolist() == expected
    assert (why is None) == (not any(expected))
