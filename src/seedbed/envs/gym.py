"""Plain Gymnasium ids (``CartPole-v1``, ``HalfCheetah-v5``) and users' own ``module:EnvId``.

The family of every id no other family owns, so the registry asks it last. A user's env is named
``module:EnvId``, Gymnasium's convention: importing ``module`` registers ``EnvId``, and every
process that makes the env (learner, local, remote and Ray actors) imports it again through
``check``. An id the user's process registered (``gym.register("MyEnv-v0", ...)`` in a module it
imported) is recorded as ``module:MyEnv-v0``, so that the other processes import that module
too. CartPole steps all E envs in one numpy call (``SameStepCartPole``).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import subprocess
import sys
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

# Gymnasium's MuJoCo tasks (their ids are NAME-vN): continuous control, with defaults of its own.
MUJOCO_TASKS = (
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
)
_NUMPY_CARTPOLES = {"CartPole-v0", "CartPole-v1"}


class SameStepCartPole(CartPoleVectorEnv):
    """Gymnasium's CartPole stepping all E envs in one numpy call, resetting on the step an
    episode ends (Gymnasium's own resets one step later, with a step that ignores the action).

    E single CartPoles in a SyncVectorEnv cost a Python step each; this costs about one for all
    E, so actors spend their time on the policy and the transport instead.
    """

    metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, action: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, info = super().step(np.asarray(action))
        ended = self.prev_done  # episodes that ended on this step: start the next ones now
        if ended.any():
            self.state[:, ended] = self.np_random.uniform(self.low, self.high, (4, ended.sum()))
            self.steps[ended] = 0
            ended[:] = False  # nothing left for the parent's next step to reset
            obs = self.state.T.astype(np.float32)
        return obs, reward, terminated, truncated, info


def import_env_module(module: str, env_id: str) -> None:
    """Import the module of a ``module:EnvId`` id, which registers the user's env with Gymnasium
    (Gymnasium's own convention; every process that makes the env imports it again)."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(
            f"cannot import '{module}' for --env {env_id} ({error}); put the module on "
            "PYTHONPATH or install its package, where the learner and every actor run"
        ) from None


def registering_module(env_id: str) -> str | None:
    """The module a fresh process imports to have ``env_id`` registered: None for Gymnasium's
    own ids, else the module of the id's entry point, checked in a fresh interpreter (with this
    process's path and plug-ins, as actors have them).

    Raises:
        ConfigError: One line, when no importable module registers the id: its entry point lives
            in ``__main__`` or is a lambda or local class, or importing its module does not
            register it (the ``gym.register`` call is in a script).
    """
    entry = gym.registry[env_id].entry_point
    if callable(entry):
        module = getattr(entry, "__module__", None) or "__main__"
        local = "<" in getattr(entry, "__qualname__", "<")  # a lambda or a class in a function
    else:
        module, local = str(entry).partition(":")[0], False
    if module.split(".")[0] == "gymnasium":
        return None
    fix = (
        "move the class and its gym.register call into a module on PYTHONPATH (imported by your "
        f"script), or name the env --env MODULE:{env_id}"
    )
    if module == "__main__" or local:
        raise ConfigError(f"{env_id} is registered with an entry point actors cannot import: {fix}")
    if not _registers(module, env_id):
        raise ConfigError(
            f"{env_id} is registered in this process only: importing '{module}', its entry "
            f"point's module, does not register it; {fix}"
        )
    return module


def _registers(module: str, env_id: str) -> bool:
    """Whether a fresh interpreter that imports this process's plug-ins and ``module`` has
    ``env_id`` in Gymnasium's registry (a plug-in that does not import there, one an earlier
    run in this process named, is passed over: the run's own would fail it elsewhere)."""
    from seedbed.plugins import imported_plugins

    code = (
        "import importlib, sys, gymnasium\n"
        f"for name in {list(imported_plugins())!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        pass\n"
        f"importlib.import_module({module!r})\n"
        f"sys.exit(0 if {env_id!r} in gymnasium.registry else 1)"
    )
    path = os.pathsep.join(p or os.getcwd() for p in sys.path)  # as spawned actors get it
    check = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path}, capture_output=True
    )
    return check.returncode == 0


@functools.cache
def continuous_actions(env_id: str) -> bool:
    """Whether ``env_id`` takes continuous (Box) actions, from one env made here: a registered
    id says nothing of its spaces. False where it cannot be made; ``check`` says why later."""
    try:
        env = gym.make(env_id)
    except Exception:
        return False
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()


class GymFamily(EnvFamily):
    """Any id in Gymnasium's registry, after importing the module a ``module:`` part names."""

    name = "gym"

    def owns(self, env_id: str) -> bool:
        return True  # the registry asks this family only when no other owns the id

    def canonical_id(self, env_id: str) -> str:
        # An id registered by a user's module becomes module:EnvId, so every process imports it.
        if ":" in env_id or env_id not in gym.registry:
            return env_id
        module = registering_module(env_id)
        return env_id if module is None else f"{module}:{env_id}"

    def preset(self, env_id: str) -> str:
        if env_id.rsplit("-v", 1)[0] in MUJOCO_TASKS:
            return "mujoco"
        return "continuous" if continuous_actions(env_id) else "classic"

    def check(self, env_id: str) -> None:
        module, _, name = env_id.rpartition(":")
        if module:
            import_env_module(module, env_id)
        if name in gym.registry:
            return
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry"
        where = f" (module '{module}' registered no such id)" if module else ""
        raise ConfigError(f"unknown environment '{env_id}'{where}{hint}")

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        # Only when asked: many users' envs take no render_mode argument at all.
        try:
            return gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
        except TypeError as error:
            if render_mode is None or "render_mode" not in str(error):
                raise
            raise ConfigError(
                f"{env_id} takes no render_mode argument, so it cannot be recorded; evaluate "
                "it without --video, or give its constructor render_mode"
            ) from None

    def make_vector(self, env_id: str, num_envs: int, seed: int, settings: Any) -> Any:
        if env_id in _NUMPY_CARTPOLES:
            return SameStepCartPole(num_envs, gym.spec(env_id).max_episode_steps)
        return super().make_vector(env_id, num_envs, seed, settings)


FAMILY = GymFamily()
