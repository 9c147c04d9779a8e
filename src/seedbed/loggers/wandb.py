"""The Weights & Biases sink: every row logged to one W&B run at step ``frames``.

It is on with ``--wandb``; ``--wandb-project``, ``--wandb-run-name`` and ``--wandb-mode`` say
where it goes. wandb is imported only when this sink is made (``pip install 'seedbed[wandb]'``).
Offline runs are written under RUN_DIR/wandb for a later ``wandb sync``. The W&B run's id is kept
in RUN_DIR/wandb-run-id, so that ``--resume`` continues the same W&B run.
"""

from __future__ import annotations

import secrets
import string
from pathlib import Path
from types import ModuleType

from seedbed.errors import ConfigError, SeedbedError
from seedbed.loggers.base import Row, RunInfo
from seedbed.telemetry import replace_atomically

ID_FILE = "wandb-run-id"


class WandbSink:
    """Logs rows to W&B with the run's settings as its config; finishes the W&B run at close.

    A resumed run goes on logging to the W&B run it started. W&B keeps what an earlier session
    logged after the checkpoint, and drops rows at steps it has already passed.
    """

    def __init__(self, run: RunInfo) -> None:
        if run.config is None:
            raise ConfigError("the wandb logger records the run's settings: it needs config=")
        wandb = _import_wandb()
        cfg = run.config.train
        # For the whole session: wandb.login and wandb.init print unless silent, and wandb's own
        # usage analytics stay off the network only when the session itself is offline.
        settings = wandb.Settings(
            mode=cfg.wandb_mode,
            silent=True,
            console="off",  # the console is the progress bar's
        )
        try:
            wandb.setup(settings)
            # Without a key, wandb.init would prompt on a terminal (and a run would wait on it).
            if cfg.wandb_mode == "online" and not wandb.login(prompt=False, verify=False):
                raise ConfigError(
                    "--wandb-mode online needs W&B credentials: run `wandb login` or set "
                    "WANDB_API_KEY, or log with --wandb-mode offline and `wandb sync "
                    f"{run.run_dir / 'wandb'}/offline-run-*` later"
                )
            self._run = wandb.init(
                project=cfg.wandb_project,
                name=cfg.wandb_run_name or run.run_dir.resolve().name,
                dir=str(run.run_dir),
                config=run.config.to_dict(),
                id=_run_id(run.run_dir, resuming=run.resume_frames is not None),
                resume="allow",  # the run with that id if W&B has it, else a new one
                reinit="create_new",  # never log into a run the calling program has open
                settings=settings,
            )
        except wandb.errors.Error as e:
            _release(wandb)
            first = (str(e).strip() or type(e).__name__).splitlines()[0]
            raise SeedbedError(
                f"--wandb: W&B could not start the run ({first}); check the network and your "
                "credentials, or use --wandb-mode offline"
            ) from None
        except BaseException:
            _release(wandb)
            raise
        self._wandb = wandb

    def write(self, row: Row) -> None:
        values = {k: v for k, v in row.items() if v is not None}
        self._run.log(values, step=int(row["frames"]))

    def close(self) -> None:
        try:
            self._run.finish()
        finally:
            _release(self._wandb)


def _import_wandb() -> ModuleType:
    try:
        import wandb
    except ImportError:
        raise ConfigError("--wandb needs the wandb package: pip install 'seedbed[wandb]'") from None
    return wandb


def _run_id(run_dir: Path, resuming: bool) -> str:
    """The W&B run id saved in the run directory when resuming, else a new one saved there."""
    path = run_dir / ID_FILE
    if resuming and path.is_file():
        saved = path.read_text(encoding="utf-8").strip()
        if saved:
            return saved
    # As wandb makes its own: 8 of a-z0-9, unique enough within a project.
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    replace_atomically(path, lambda tmp: tmp.write_text(run_id + "\n", encoding="utf-8"))
    return run_id


def _release(wandb: ModuleType) -> None:
    """Stop wandb's service process unless the calling program still has a run open."""
    if wandb.run is None:
        wandb.teardown()
