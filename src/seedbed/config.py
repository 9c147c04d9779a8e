"""Typed, validated settings: one dataclass is at once the CLI, the help text and the record.

Settings resolve in this order, later winning: dataclass defaults, ``--config FILE.yaml``, flags.
Each setting is a dataclass field whose metadata carries its help text; flags, YAML keys and the
saved ``config.yaml`` are all derived from the fields, so they cannot drift apart.

This module is the bottom of the settings: the run's own (``TrainConfig``) and the machinery that
agents' and env families' settings are declared with. It imports neither: ``seedbed.resolve``
merges all three, with each env family's and agent's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from seedbed.errors import ConfigError
from seedbed.transport import check_transport
from seedbed.transport.address import check_address, replica_address

_NONE_WORDS = {"none", "null", "off"}


def setting(default: Any, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """A dataclass field with its help text (``help`` mirrors argparse's name) and, where the
    type's own would say too little, its flag's metavar; tuples are immutable defaults."""
    metadata = {"help": help} if metavar is None else {"help": help, "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class TrainConfig:
    """How a training run is laid out: environments, processes, budget and bookkeeping."""

    env: str = setting(
        "CartPole-v1",
        "environment id: a Gymnasium id, atari:GAME (e.g. atari:Pong), dmc:DOMAIN-TASK, "
        "football:SCENARIO, dmlab:LEVEL, or your own module:EnvId",
    )
    # The env's preset names the agent it trains with by default (seedbed.presets).
    agent: str = setting(
        "vtrace",
        "learning algorithm; its default is the env's preset's (seedbed/presets/ROW.yaml): "
        "--print-config shows it",
    )
    actors: int = setting(2, "actor processes, each stepping --envs-per-actor environments")
    envs_per_actor: int = setting(32, "environments each actor steps together")
    unroll: int = setting(16, "steps T per unroll; consecutive unrolls share one step")
    batch: int = setting(32, "unrolls B per learner step")
    # Past the presets' 16-64 envs: what a call costs besides the network (gathering the rows,
    # the unrolls, the answers) is then shared by more actors, as many remote ones send at once.
    inference_batch: int = setting(256, "most environments per central inference call")
    inference: Literal["central", "local"] = setting(
        "central",
        "who picks actions: central (SEED: the learner, batched over all actors) or local "
        "(ActorQ: each actor, with its own copy of the policy)",
    )
    broadcast_every: int = setting(
        1, "learner steps between policy broadcasts (to local actors, or to an int8 central copy)"
    )
    actor_precision: Literal["fp32", "fp16", "int8"] = setting(
        "fp32", "with --inference local: the precision of the policy actors receive and act with"
    )
    precision: Literal["fp32", "int8"] = setting(
        "fp32", "with --inference central: int8 acts with an int8 copy of the policy (CPU only)"
    )
    inference_timeout_ms: float = setting(
        2.0, "longest wait for a fuller inference batch once a request arrived"
    )
    inference_threads: int = setting(
        1,
        "threads serving inference requests: while one acts, another takes the next request "
        "(each takes whole requests, so an env is served by one thread at a time)",
    )
    queue_size: int = setting(32, "most full unrolls waiting for the learner (backpressure)")
    lockstep: bool = setting(
        False,
        "acting waits while a batch is waiting for or in the learner, so each batch is acted by "
        "the newest policy (no policy lag; the actors idle while it learns): PPO, V-trace",
    )
    total_frames: int = setting(5_000_000, "stop after this many environment frames")
    lr_schedule: Literal["constant", "linear"] = setting(
        "constant",
        "every learning rate over the run: constant, or falling linearly to 0 at --total-frames",
    )
    lr_hold_frames: int = setting(
        0,
        "with --lr-schedule linear: frames at the initial rates before they start to fall (the "
        "whole run, if --total-frames is not more)",
    )
    target_return: float | None = setting(
        475.0, "stop once the mean return of the last 100 episodes reaches this (none: never)"
    )
    target_episodes: int = setting(
        100,
        "finished episodes the mean must cover before --target-return counts (1-100; tasks "
        "with long episodes may settle for fewer, and the summary says how many)",
    )
    seed: int = setting(0, "seed for environments, networks and sampling")
    device: Literal["cpu", "cuda"] = setting("cpu", "device for inference and learning")
    threads: int = setting(1, "torch threads in the learner process (0: torch's default)")
    learner_threads: int = setting(
        0,
        "torch threads for the learner's updates; inference uses --threads (0: one fewer than "
        "the process has, at least 1, leaving a core to inference and the actors)",
    )
    learner_replicas: int = setting(
        1,
        "learner processes; each serves its share of the actors and batch, and gradients are "
        "averaged every step (seedbed.replicate)",
    )
    learner_process: bool = setting(
        False,
        "run the learner's updates in a process of their own, so they never wait on the "
        "interpreter lock that central inference holds (small networks learn faster)",
    )
    run_dir: str | None = setting(None, "run directory; none: runs/ENV-AGENT-TIMESTAMP")
    resume: bool = setting(False, "continue the run in --run-dir from its last checkpoint")
    resume_mismatch: Literal["refuse", "accept"] = setting(
        "refuse",
        "with --resume, a checkpoint made with another env, agent, or setting of the agent or env "
        "than this run's: refuse it (naming the setting), or accept it on purpose",
    )
    checkpoint_every_s: float = setting(60.0, "seconds between periodic checkpoints")
    keep_checkpoints: int = setting(3, "periodic checkpoints kept (the final one is kept too)")
    log_every_s: float = setting(1.0, "seconds between metrics rows")
    max_actor_restarts: int = setting(20, "give up once actors have been restarted this often")
    progress: bool = setting(True, "show the live progress display")
    # A name in seedbed.transport.TRANSPORTS, checked there (a new backend needs no line here).
    transport: str = setting(
        "shm",
        "how actor processes on this host reach the learner, a name in "
        "seedbed.transport.TRANSPORTS (shm: shared memory; plug-ins add more); remote actors "
        "(--listen) come over gRPC into the same server",
    )
    # Imported by every process of the run before it reads settings (seedbed.plugins).
    plugins: tuple[str, ...] = setting(
        (),
        "your modules (on PYTHONPATH) that register env families, agents, transports or "
        "loggers; the learner and every actor import them first",
        metavar="MODULE,...",
    )
    # Names in seedbed.loggers.LOGGERS, checked by resolve.
    loggers: tuple[str, ...] = setting(
        (),
        "metric sinks to feed beside metrics.csv, TensorBoard and the console: names in "
        "seedbed.loggers.LOGGERS (plug-ins add more)",
        metavar="NAME,...",
    )
    # Remote actors (seedbed actor --connect) over gRPC; see seedbed.transport.remote.
    listen: str | None = setting(
        None,
        "serve remote actors on HOST:PORT (port 0: any free one) or unix:PATH; with "
        "--learner-replicas this is replica 0's, which places each actor on a replica",
    )
    remote_actors: int = setting(
        8,
        "with --listen: most remote actors at once (slots), split over --learner-replicas as "
        "evenly as they go",
    )
    # 1 keeps the gateway in the learner's process: the simplest layout, and enough for a few
    # actors; processes take the decoding off the learner's interpreter (docs/benchmarks.md).
    gateways: int = setting(
        1,
        "with --listen: gRPC gateway processes sharing the port, each writing remote actors' "
        "steps into the shared-memory slots; 1: the gateway runs in the learner's process",
    )
    # gRPC costs each end more CPU per message than a small step is worth (bench/wire.py); the
    # socket wire carries the same messages, with the same checks, on a plain socket.
    wire: Literal["grpc", "socket"] = setting(
        "grpc",
        "with --listen: how remote actors' messages travel: gRPC, or the same messages on a plain "
        "TCP or Unix socket (less CPU a step); actors need the same --wire",
    )
    token_file: str | None = setting(
        None,
        "file holding the secret remote actors must present; none: a random one, written to "
        "RUN_DIR/actor-token",
    )
    tls_cert: str | None = setting(None, "with --listen: PEM certificate to serve TLS with")
    tls_key: str | None = setting(None, "with --listen: PEM private key of --tls-cert")
    # Energy and carbon of the run (seedbed.energy); USA is CodeCarbon's own fallback country.
    energy: bool = setting(True, "measure energy and carbon with CodeCarbon (offline, no files)")
    country: str = setting(
        "USA", "ISO 3166 alpha-3 country code for the carbon intensity of the grid (e.g. FRA)"
    )
    # Weights & Biases (seedbed.loggers.wandb), beside metrics.csv and TensorBoard.
    wandb: bool = setting(
        False, "also log metrics to Weights & Biases (pip install 'seedbed[wandb]')"
    )
    wandb_project: str = setting("seedbed", "with --wandb: the W&B project")
    wandb_run_name: str | None = setting(
        None, "with --wandb: the W&B run name (none: the run dir's)"
    )
    wandb_mode: Literal["online", "offline"] = setting(
        "online",
        "with --wandb: online needs `wandb login` or WANDB_API_KEY; offline writes RUN_DIR/wandb "
        "for a later `wandb sync`",
    )

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        if self.actors < 0 or (self.actors == 0 and not self.listen):
            raise ConfigError(
                f"--actors must be positive, got {self.actors} (0 only with --listen, when "
                "every actor is remote)"
            )
        if self.listen:
            check_address(self.listen, "--listen")
            if self.remote_actors <= 0:
                raise ConfigError(f"--remote-actors must be positive, got {self.remote_actors}")
            if self.gateways > 1 and self.listen.startswith("unix:"):
                raise ConfigError(
                    f"--gateways {self.gateways} shares a TCP port among processes; a Unix "
                    "socket cannot be shared: --listen HOST:PORT, or --gateways 1"
                )
            if self.gateways > 1 and self.transport != "shm":
                raise ConfigError(
                    f"--gateways {self.gateways} writes into shared memory: use --transport shm"
                )
        if self.gateways < 1:
            raise ConfigError(f"--gateways must be at least 1, got {self.gateways}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        for name in (
            "envs_per_actor",
            "unroll",
            "batch",
            "inference_batch",
            "inference_threads",
            "queue_size",
            "total_frames",
            "keep_checkpoints",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{flag(name)} must be positive, got {getattr(self, name)}")
        for name in ("inference_timeout_ms", "checkpoint_every_s", "log_every_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        for name in ("threads", "learner_threads", "max_actor_restarts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        if not (len(self.country) == 3 and self.country.isascii() and self.country.isalpha()):
            raise ConfigError(
                f"--country must be a 3-letter ISO code like USA or FRA, got {self.country!r}"
            )
        if not 1 <= self.target_episodes <= 100:
            raise ConfigError(
                f"--target-episodes must be between 1 and 100 (the return window), "
                f"got {self.target_episodes}"
            )
        if self.learner_replicas < 1:
            raise ConfigError(f"--learner-replicas must be positive, got {self.learner_replicas}")
        if self.learner_replicas > 1:
            self._check_replicas()
        if self.learner_process:
            self._check_learner_process()
        self._check_inference()
        check_transport(self.transport, actor_processes=True)
        if self.resume and not self.run_dir:
            raise ConfigError("--resume needs --run-dir naming the run to continue")
        self._check_lr_hold()

    def _check_lr_hold(self) -> None:
        if self.lr_hold_frames == 0:
            return
        if self.lr_schedule != "linear":
            raise ConfigError("--lr-hold-frames holds a falling rate: add --lr-schedule linear")
        if self.lr_hold_frames < 0:  # a hold as long as the run keeps the rate constant
            raise ConfigError(f"--lr-hold-frames must be >= 0, got {self.lr_hold_frames}")

    def _check_inference(self) -> None:
        if self.broadcast_every <= 0:
            raise ConfigError(f"--broadcast-every must be positive, got {self.broadcast_every}")
        if self.inference == "central" and self.actor_precision != "fp32":
            raise ConfigError(
                "--actor-precision is for --inference local (actors with their own policy); "
                "central inference acts in --precision"
            )
        if self.inference == "local" and self.precision != "fp32":
            raise ConfigError(
                "--precision is for --inference central; local actors act in --actor-precision"
            )
        if self.precision == "int8" and self.device != "cpu":
            raise ConfigError(
                "--precision int8 uses PyTorch's int8 CPU kernels: use --device cpu, or fp32"
            )

    def _check_replicas(self) -> None:
        n = self.learner_replicas
        for name in ("actors", "batch"):
            if getattr(self, name) % n:
                raise ConfigError(
                    f"--{flag(name)} {getattr(self, name)} does not split evenly over "
                    f"--learner-replicas {n}; make it a multiple of {n}"
                )
        if self.listen and self.remote_actors < n:
            raise ConfigError(
                f"--remote-actors {self.remote_actors} is fewer than --learner-replicas {n}: "
                f"each replica serves remote actors; give at least {n}"
            )

    def _check_learner_process(self) -> None:
        if self.learner_replicas > 1:
            raise ConfigError(
                "--learner-process works with one learner replica (each replica already learns "
                "in a process of its own); leave one of them off"
            )
        if self.device != "cpu":
            raise ConfigError(
                "--learner-process is for CPU runs for now; leave it off with --device cuda"
            )

    def replica_shard(self, replica_id: int) -> TrainConfig:
        """Replica ``replica_id``'s part of the run: its actors, its share of each batch and of
        the queue, and seeds of its own (the networks still start alike: see ``seed``). With
        --listen, its share of the remote slots (the first replicas take one more where they do
        not split evenly) and its own address: replica 0 keeps --listen, the front door actors
        dial, and the others listen beside it (``transport.address.replica_address``)."""
        n = self.learner_replicas
        if n == 1:
            return self
        return dataclasses.replace(
            self,
            actors=self.actors // n,
            remote_actors=self.remote_actors // n + (replica_id < self.remote_actors % n),
            listen=replica_address(self.listen, replica_id) if self.listen else None,
            batch=self.batch // n,
            queue_size=-(-self.queue_size // n),
            seed=self.seed + 10_007 * replica_id,
        )

    @property
    def num_slots(self) -> int:
        """Actor slots: local actors first, then, with --listen, the remote ones."""
        return self.actors + (self.remote_actors if self.listen else 0)

    @property
    def num_envs(self) -> int:
        """All environments across all actor slots."""
        return self.num_slots * self.envs_per_actor


#: ``TrainConfig``'s settings by topic, in the order ``seedbed train --help`` shows them; the
#: chosen agent's and env family's settings come between "learner" and "remote actors". A new
#: setting belongs in one group: tests/test_cli.py fails on one left out (which --help would show
#: under "run").
TRAIN_GROUPS: dict[str, tuple[str, ...]] = {
    "run": (
        "env",
        "agent",
        "total_frames",
        "target_return",
        "target_episodes",
        "seed",
        "device",
        "run_dir",
        "resume",
        "resume_mismatch",
        "checkpoint_every_s",
        "keep_checkpoints",
        "plugins",
    ),
    "actors and inference": (
        "actors",
        "envs_per_actor",
        "inference",
        "inference_batch",
        "inference_timeout_ms",
        "inference_threads",
        "threads",
        "precision",
        "actor_precision",
        "broadcast_every",
        "transport",
        "max_actor_restarts",
    ),
    "learner": (
        "unroll",
        "batch",
        "queue_size",
        "lockstep",
        "lr_schedule",
        "lr_hold_frames",
        "learner_threads",
        "learner_replicas",
        "learner_process",
    ),
    "remote actors": (
        "listen",
        "remote_actors",
        "gateways",
        "wire",
        "token_file",
        "tls_cert",
        "tls_key",
    ),
    "logging": (
        "log_every_s",
        "progress",
        "loggers",
        "energy",
        "country",
        "wandb",
        "wandb_project",
        "wandb_run_name",
        "wandb_mode",
    ),
}


def flag(name: str) -> str:
    """The command-line spelling of a field name."""
    return name.replace("_", "-")


def fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """The fields of a settings dataclass with their resolved type hints."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _optional_inner(tp: Any) -> Any | None:
    """``X`` for ``X | None`` (or Optional[X]), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


def coerce(name: str, value: Any, tp: Any) -> Any:
    """Convert a YAML or flag value to the field's type, or raise ConfigError naming the flag."""
    inner = _optional_inner(tp)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.lower() in _NONE_WORDS):
            return None
        return coerce(name, value, inner)
    origin = typing.get_origin(tp)
    try:
        if origin is Literal:
            choices = typing.get_args(tp)
            if value not in choices:
                raise ValueError(f"choose one of {', '.join(map(str, choices))}")
            return value
        if origin is tuple:
            (item_tp, _) = typing.get_args(tp)
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(item_tp(str(v).strip()) for v in items if str(v).strip())
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "yes", "1", "on"):
                    return True
                if value.lower() in ("false", "no", "0", "off"):
                    return False
                raise ValueError("expected true or false")
            return bool(value)
        if tp is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError("expected a whole number")
            return (
                int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
            )
        if tp is float:
            return float(value)
        if tp is str:
            return str(value)
    except (TypeError, ValueError, OverflowError) as e:  # int(inf) overflows
        raise ConfigError(f"--{flag(name)}: invalid value {value!r} ({e})") from None
    raise TypeError(f"setting {name} has unsupported type {tp}")


def build(cls: type, values: dict[str, Any]) -> Any:
    """Instantiate a settings dataclass from raw values, coercing each one."""
    known = {f.name: tp for f, tp in fields(cls)}
    out = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(unknown_message(key, known))
        out[key] = coerce(key, value, known[key])
    return cls(**out)


def unknown_message(key: str, known: typing.Iterable[str]) -> str:
    """A one-line error for a setting that does not exist, with the closest real ones."""
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `seedbed train --help`"
    return f"unknown setting {key!r}{hint}"  # repr: one line, whatever the key holds


def to_dict(obj: Any) -> dict[str, Any]:
    """A settings dataclass as plain YAML-friendly values (tuples become lists)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with a one-line error when it is missing or not a mapping."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not text
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise ConfigError(f"config file {path} cannot be read ({why})") from None
    except yaml.YAMLError as e:
        raise ConfigError(
            f"config file {path} is not valid YAML: {str(e).splitlines()[0]}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def add_arguments(
    group: argparse._ArgumentGroup,
    cls: type,
    seen: set[str],
    shown: dict[str, Any] | None = None,
    names: typing.Sequence[str] | None = None,
) -> None:
    """Add one flag per field of ``cls`` (skipping names in ``seen``); defaults stay unset.

    Flags default to ``argparse.SUPPRESS`` so that only the flags a user typed override the
    YAML file; the help text shows the default in ``shown`` (a preset's), else the dataclass's.
    ``names``: only these fields, in this order (None: every field, in the class's order).
    """
    shown = shown or {}
    typed = fields(cls)
    if names is not None:
        by_name = {f.name: (f, tp) for f, tp in typed}
        typed = [by_name[name] for name in names]
    for f, tp in typed:
        if f.name in seen:
            continue
        seen.add(f.name)
        default = shown.get(f.name, f.default)
        text = ",".join(map(str, default)) if isinstance(default, tuple | list) else default
        helptext = f.metadata.get("help", "") + (f" (default: {text})" if text != "" else "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": helptext}
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = f.metadata.get("metavar") or _metavar(tp)
        group.add_argument(f"--{flag(f.name)}", **kwargs)


def _metavar(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return _metavar(inner) + "|none"
    if typing.get_origin(tp) is Literal:
        return "{" + ",".join(map(str, typing.get_args(tp))) + "}"
    if typing.get_origin(tp) is tuple:
        item = _metavar(typing.get_args(tp)[0])
        return f"{item},{item},..."
    return {int: "N", float: "X", str: "S"}.get(tp, "V")


@dataclasses.dataclass
class RunConfig:
    """Everything a run needs: the layout, the chosen agent's settings and the env family's."""

    train: TrainConfig
    agent: Any
    env_settings: Any = None  # the env family's settings dataclass (e.g. AtariSettings)
    family: str = ""  # the env family's name: the config section its settings are saved in

    def to_dict(self) -> dict[str, Any]:
        """The nested form saved as ``config.yaml``: run settings, then the agent's section and
        the env family's (where it has settings)."""
        out = {**to_dict(self.train), self.train.agent: to_dict(self.agent)}
        if self.env_settings is not None and dataclasses.fields(self.env_settings):
            out[self.family] = to_dict(self.env_settings)
        return out

    def validate(self) -> None:
        self.train.validate()
        self.agent.validate()
        if hasattr(self.env_settings, "validate"):
            self.env_settings.validate()
        if hasattr(self.env_settings, "check_run"):  # what the env family needs of the run
            self.env_settings.check_run(self.train)
        self.agent.check_run(self.train)  # what the agent needs of the run's layout
