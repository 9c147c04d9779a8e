"""Run a trained policy for some episodes, report its return, optionally record a video."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from seedbed.agents import make_agent
from seedbed.envs import family_for, make_env, make_spec
from seedbed.errors import SeedbedError
from seedbed.inference.acting import ActingTable
from seedbed.plugins import import_plugins
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import latest_checkpoint, load_checkpoint
from seedbed.types import EnvSpec


def find_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a file, else the newest checkpoint of the run directory."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise SeedbedError(f"{path} holds no checkpoint; train first or name a .pt file")
        return found
    raise SeedbedError(f"{path} is neither a run directory nor a checkpoint file")


def evaluate(
    path: str | Path,
    episodes: int,
    video: str | None = None,
    seed: int = 12345,
    device: str = "cpu",
    plugins: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run ``episodes`` episodes with the policy saved at ``path``; mean, std, min, max return.

    Only the modules named in ``plugins`` are imported: a checkpoint that names others (as
    plug-ins, or as the ``module:`` of its env id) is refused in one line.
    """
    checkpoint = find_checkpoint(path)
    state = load_checkpoint(checkpoint)
    saved = state.get("config")
    if not isinstance(saved, dict):
        raise SeedbedError(f"checkpoint {checkpoint} holds no settings to evaluate it with")
    check_imports(checkpoint, saved, plugins)
    config = resolve([saved])
    settings = config.env_settings
    spec = make_spec(config.train.env, settings)
    agent = make_agent(config.train.agent, spec, config.agent, torch.device(device))
    agent.load_state_dict(state["agent"])
    returns = []
    with _offscreen_rendering() if video else contextlib.nullcontext():
        env = make_env(config.train.env, settings, render_mode="rgb_array" if video else None)
        writer = _video_writer(video, env) if video else None
        try:
            for episode in range(episodes):
                returns.append(_episode(agent, spec, env, seed + episode, device, writer))
        finally:
            env.close()
            if writer is not None:
                writer.close()
    r = np.asarray(returns)
    return {
        "env": config.train.env,
        "episodes": episodes,
        "returns": r.tolist(),
        "mean_return": float(r.mean()),
        "std_return": float(r.std()),
        "min_return": float(r.min()),
        "max_return": float(r.max()),
    }


def check_imports(checkpoint: Path, saved: dict[str, Any], plugins: tuple[str, ...]) -> None:
    """Import ``plugins``, and check that the modules the saved settings of ``checkpoint``
    would import (its plug-ins, its env id's ``module:``) are among them, or imported in this
    process already (a script that trained the run): code runs from a file only where its user
    named it.

    Raises:
        SeedbedError: One line listing the modules not named, and how to name them.
    """
    named = saved.get("plugins") or []
    wanted = list(named) if isinstance(named, list | tuple) else [str(named)]
    import_plugins(plugins)
    trusted = {*plugins, *sys.modules}  # importing a module again runs nothing
    unnamed = [m for m in wanted if m not in trusted]
    if not unnamed:  # the family of the env id is known only once its plug-in is in
        env_id = str(saved.get("env", ""))
        module = env_id.rpartition(":")[0]
        if module and family_for(env_id).name == "gym" and module not in trusted:
            unnamed.append(module)
    if unnamed:
        modules = ",".join(dict.fromkeys([*plugins, *wanted, *unnamed]))
        raise SeedbedError(
            f"checkpoint {checkpoint} imports {', '.join(unnamed)}, which eval imports only "
            f"when you name it: if you trust that code, pass --plugins {modules}"
        )


@contextlib.contextmanager
def _offscreen_rendering() -> Iterator[None]:
    """Let pygame-drawn envs (gymnasium's classic control) render with no display at all.

    Their rgb_array mode draws on an offscreen surface but still calls ``pygame.display.init()``,
    where SDL probes for a desktop (Wayland, X11) and, with XDG_RUNTIME_DIR unset, prints
    "error: XDG_RUNTIME_DIR is invalid or not set" from a run that works. SDL's dummy video driver
    needs nothing. A driver the user chose is kept, and the variable is restored afterwards, so
    that a window this process opens later still finds the desktop.
    """
    before = os.environ.get("SDL_VIDEODRIVER")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SDL_VIDEODRIVER", None)


def _video_writer(video: str, env: gym.Env) -> Any:
    import imageio.v2 as imageio

    Path(video).parent.mkdir(parents=True, exist_ok=True)
    fps = env.metadata.get("render_fps", 30)
    return imageio.get_writer(video, fps=fps, macro_block_size=1)


@torch.no_grad()
def _episode(agent: Any, spec: EnvSpec, env: gym.Env, seed: int, device: str, writer: Any) -> float:
    obs, _ = env.reset(seed=seed)
    torch.manual_seed(seed)
    table = ActingTable(agent.initial_state, 1, spec.action_shape, spec.action_dtype, device)
    reward, done, total = 0.0, True, 0.0
    while True:
        if writer is not None:
            writer.append_data(env.render())
        step, state = table.inputs(
            None,
            torch.as_tensor(np.asarray(obs)[None]),
            torch.tensor([reward], dtype=torch.float32),
            torch.tensor([done]),
        )
        out = agent.act(agent.network, step, state)
        table.record(None, out.action, out.state)
        action = table.prev_action[0].numpy()  # the action just taken, on the CPU
        obs, reward, terminated, truncated, _ = env.step(action if spec.continuous else int(action))
        total += float(reward)
        done = False
        if terminated or truncated:
            return total
