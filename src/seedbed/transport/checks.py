"""What the learner refuses in a step from an actor: values no real environment or policy gives.

Actors are other processes, other machines and users' environments. One NaN or inf that they
send spreads through every loss, statistic and checkpoint it reaches, and one action outside the
action space fails an index on the learner. ``check_step`` finds the envs of a step that carry
such a value, so the inference server can refuse those envs' step (and the gateway can tell an
actor that keeps sending them to go), while the others' steps go on.
"""

from __future__ import annotations

import numpy as np

# Past any real task's reward or return, and far enough below float32's largest value that a
# hundred such returns still sum to a finite mean.
MAX_ABS_REWARD = 1e30
# Steps in a row an env may send refused values before its actor is told to stop.
REFUSED_IN_A_ROW = 100


def check_step(
    obs: np.ndarray,
    reward: np.ndarray,
    acted: dict[str, np.ndarray] | None = None,
    num_actions: int = 0,
) -> tuple[np.ndarray, str | None]:
    """Which envs of a step to refuse, and why (the first reason found; None if no env).

    Args:
        obs: ``[k, ...]`` in the env's dtype; float ones must be finite.
        reward: ``[k]``; finite and at most ``MAX_ABS_REWARD`` in size.
        acted: Local inference: what the actors acted, ``[k, ...]`` per field; float fields
            (logits, recurrent state, continuous actions) must be finite.
        num_actions: Discrete actions must lie in ``[0, num_actions)``; 0: not checked.

    Returns:
        A ``[k]`` bool mask of the envs to refuse, and the reason for the first kind found.
    """
    reward = np.asarray(reward)
    if _all_fine(obs, reward, acted, num_actions):
        return np.zeros(len(reward), np.bool_), None
    bad = np.zeros(len(reward), np.bool_)
    why = None
    with np.errstate(invalid="ignore", over="ignore"):
        absurd = ~(np.abs(reward.astype(np.float64)) <= MAX_ABS_REWARD)  # NaN too
    checks = [(f"reward that is not finite or over {MAX_ABS_REWARD:g}", absurd)]
    checks.append(("non-finite obs", _nonfinite(obs)))
    for name, value in (acted or {}).items():
        checks.append((f"non-finite {name}", _nonfinite(value)))
    if acted is not None and num_actions > 0 and "action" in acted:
        action = np.asarray(acted["action"]).reshape(len(reward), -1)
        out = ((action < 0) | (action >= num_actions)).any(axis=1)
        checks.append((f"action outside 0..{num_actions - 1}", out))
    for reason, rows in checks:
        if rows.any():
            bad |= rows
            why = why or reason
    return bad, why


def _all_fine(
    obs: np.ndarray,
    reward: np.ndarray,
    acted: dict[str, np.ndarray] | None,
    num_actions: int,
) -> bool:
    """Whether no env of the step has anything to refuse, checked over whole arrays: the
    common case, and a few calls where finding the rows takes a few per field."""
    with np.errstate(invalid="ignore", over="ignore"):
        if not (np.abs(reward.astype(np.float64)) <= MAX_ABS_REWARD).all():  # NaN too
            return False
    fields = [obs, *(acted or {}).values()]
    if any(a.dtype.kind in "fc" and not np.isfinite(a).all() for a in map(np.asarray, fields)):
        return False
    if acted is not None and num_actions > 0 and "action" in acted:
        action = np.asarray(acted["action"])
        return action.size == 0 or (action.min() >= 0 and action.max() < num_actions)
    return True


def _nonfinite(array: np.ndarray) -> np.ndarray:
    """``[k]``: which rows of ``array`` hold a NaN or inf (none, for integer and bool arrays)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc" or array.size == 0:
        return np.zeros(len(array), np.bool_)
    return ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
