"""The ``seedbed`` command: ``train``, ``eval``, ``launch``, ``actor``, ``plot`` and ``replicate``.

Only argument parsing lives here; each command resolves its settings and hands them to the
runtime. Heavy imports (torch) happen inside the commands so that ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from seedbed import __version__
from seedbed.config import TRAIN_GROUPS, TrainConfig, add_arguments, coerce, load_yaml
from seedbed.errors import ConfigError, SeedbedError
from seedbed.plugins import import_plugins
from seedbed.resolve import Layer, explain, resolve, resolve_with_sources
from seedbed.transport.address import check_address


def _add_settings(p: argparse.ArgumentParser, shown: dict[str, Any] | None) -> None:
    """``--config``, ``--print-config`` and one flag per run, env family and agent setting, by
    topic: the run's groups (``TRAIN_GROUPS``) with the chosen agent's and env family's after
    "learner", then the other families' and agents'. ``shown``: the defaults ``--help`` shows
    (the preset's for the env and agent typed, which it also takes as the chosen ones)."""
    from seedbed.agents import AGENTS
    from seedbed.envs import families, family_for

    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of settings", default=None)
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the settings this run would use, each with where it comes from (built-in, "
        "preset, --config, flag), as a YAML file --config takes; then exit",
    )
    agent = shown["agent"] if shown else None
    family = family_for(shown["env"]) if shown else None
    grouped = {name for names in TRAIN_GROUPS.values() for name in names}
    left_out = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in grouped)
    seen: set[str] = set()
    for title, names in TRAIN_GROUPS.items():
        if title == "run":
            names = (*names, *left_out)
        add_arguments(p.add_argument_group(title), TrainConfig, seen, shown, names)
        if title == "learner":
            if agent is not None:
                _agent_group(p, agent, seen, shown)
            if family is not None:
                _family_group(p, family, seen, shown)
    for other in families():
        if other is not family:
            _family_group(p, other, seen, shown)
    for name in AGENTS:
        if name != agent:
            _agent_group(p, name, seen, shown)


def _agent_group(
    p: argparse.ArgumentParser, name: str, seen: set[str], shown: dict[str, Any] | None
) -> None:
    from seedbed.agents import config_class

    add_arguments(p.add_argument_group(f"{name} agent settings"), config_class(name), seen, shown)


def _family_group(
    p: argparse.ArgumentParser, family: Any, seen: set[str], shown: dict[str, Any] | None
) -> None:
    if not dataclasses.fields(family.settings_class):
        return  # no settings: no group in --help
    ids = f"{family.prefix}... ids" if family.prefix else "its ids"
    group = p.add_argument_group(f"{family.name} settings ({ids}; YAML: {family.name}: ...)")
    add_arguments(group, family.settings_class, seen, shown)


_RESUMED = "the resumed run"  # the name of the layer of a resumed run's saved settings


def _named_layers(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> list[Layer]:
    """The setting layers the user gave, named: a resumed run's config, --config, then flags."""
    own = ("command", "config", "verbose", "print_config", *skip)
    flags = {k: v for k, v in vars(args).items() if k not in own}
    layers: list[Layer] = []
    if flags.get("resume") and flags.get("run_dir"):
        run_dir = Path(flags["run_dir"])
        layers.append((f"{_RESUMED} {run_dir}", _resumed_settings(run_dir)))
    if args.config:
        layers.append((f"--config {args.config}", load_yaml(args.config)))
    layers.append(("flag", flags))
    return layers


def _settings_layers(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> list[dict]:
    """The setting layers the user gave: a resumed run's config, --config, then flags."""
    return [values for _, values in _named_layers(args, skip)]


def _print_config(layers: list[Layer]) -> int:
    config, sources = resolve_with_sources(layers)
    print(explain(config, sources))
    return 0


def _resumed_settings(run_dir: Path) -> dict[str, Any]:
    """The settings a resumed run was saved with: its ``config.yaml``, or where that is gone,
    those its newest loadable checkpoint holds (never the defaults, without a word)."""
    saved = run_dir / "config.yaml"
    if saved.exists():
        return load_yaml(saved)
    from seedbed.runtime.checkpoint import load_latest

    found = load_latest(run_dir, set_aside=False)
    if found is None or not isinstance(found[1].get("config"), dict):
        return {}  # the run itself says what is missing
    path, payload = found
    logging.getLogger(__name__).warning(
        "%s has no config.yaml: resuming with the settings saved in %s", run_dir, path.name
    )
    return {**payload["config"], "resume_mismatch": "refuse"}  # accepted only on purpose


def _report(summary: dict[str, Any]) -> int:
    """Print how a run ended; return the command's exit code."""
    reached = summary["target_reached_frames"]
    ret = summary["mean_return_100"]
    print(
        f"stopped ({summary['stop_reason']}) after {summary['frames']:,} frames in "
        f"{summary['wall_s']:.1f} s ({summary['mean_fps']:,.0f} frames/s); "
        f"mean return of the last 100 episodes: {'n/a' if ret is None else f'{ret:.1f}'}"
    )
    if reached is not None:
        print(
            f"target return {summary['target_return']:g} reached at {reached:,} frames, "
            f"{summary['target_reached_wall_s']:.1f} s"
        )
    print(f"frames are {summary['frames_counted_as']}")
    if summary.get("energy"):
        print(_energy_line(summary["energy"]))
    print(f"run directory: {summary['run_dir']}")
    if "curve" in summary:
        print(f"learning curve: {summary['curve']}")
    return {"error": 1, "interrupted": 130}.get(summary["stop_reason"], 0)


def _energy_line(energy: dict[str, Any]) -> str:
    """E.g. ``energy: 0.0012 kWh, 0.00046 kg CO2e (USA grid; estimated: ...)``."""
    kwh, kg = energy["energy_kwh"], energy["emissions_kg_co2e"]
    how = energy["method"] if energy["power"] == "measured" else f"estimated: {energy['caveat']}"
    return (
        f"energy: {'n/a' if kwh is None else f'{kwh:.4g}'} kWh, "
        f"{'n/a' if kg is None else f'{kg:.3g}'} kg CO2e ({energy['country']} grid; {how})"
    )


def _train_parser(subparsers: Any, shown: dict[str, Any] | None) -> None:
    default = resolve([]).train
    p = subparsers.add_parser(
        "train",
        help=f"train an agent (default: {default.agent} on {default.env}, to a mean return of "
        f"{default.target_return:g})",
        description="Train an agent with central inference. Settings come from the built-in "
        "defaults, then the preset of the env's family and agent (seedbed/presets), then "
        "--config FILE.yaml, then flags (flags win). With --env (and --agent), --help shows "
        "that env's defaults, and its agent's and env family's settings after the run's; "
        "--print-config shows a run's settings and where each comes from.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_settings(p, shown)
    p.set_defaults(command=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from seedbed.runtime.train import train

    named = _named_layers(args)
    named.extend(_launcher_layers(named))
    if args.print_config:
        return _print_config(named)
    config = resolve([values for _, values in named])
    signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's stop ends the run as Ctrl-C does
    summary = train(config)  # which stops in order at a signal (runtime/signals.py)
    # The run is over and written: the late second of two quick signals must not break the
    # exit with a traceback.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if summary is None:  # a replica other than 0, under torchrun
        print("this replica is done; replica 0 wrote the run's files")
        return 0
    return _report(summary)


def _launcher_layers(named: list[Layer]) -> list[Layer]:
    """Under torchrun (``WORLD_SIZE`` processes): one replica each, whatever the resumed run's
    settings said; a ``--learner-replicas`` given that disagrees is refused in one line."""
    from seedbed.replicate import launched_replicas

    world = launched_replicas()
    if world == 1:
        return []
    for name, values in named:
        given = values.get("learner_replicas")
        if given is not None and not name.startswith(_RESUMED) and int(given) != world:
            raise ConfigError(
                f"--learner-replicas {given} ({name}) does not match the {world} processes "
                "torchrun started (WORLD_SIZE), one replica each; leave it out"
            )
    return [("torchrun's WORLD_SIZE", {"learner_replicas": world})]


def _launch_parser(subparsers: Any, shown: dict[str, Any] | None) -> None:
    p = subparsers.add_parser(
        "launch",
        help="train on a Ray cluster: the learner and --actors remote actors as Ray actors",
        description="Start a learner and --actors actors on Ray (a local Ray without ADDRESS), "
        "restart actors that die, and stop everything at the end or on Ctrl-C. Takes every "
        "train setting; --actors counts the Ray actors, each stepping --envs-per-actor envs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        required=True,
        metavar="ADDRESS",
        help="the Ray cluster (e.g. 10.0.0.1:6379, or auto); without ADDRESS a local Ray",
    )
    p.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs Ray reserves per actor")
    p.add_argument("--learner-cpus", type=float, default=1.0, help="CPUs for the learner")
    p.add_argument(
        "--fit-actors",
        action="store_true",
        help="if the cluster has no room for every actor, start as many as fit instead of "
        "refusing to start",
    )
    _add_settings(p, shown)
    p.set_defaults(command=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    from seedbed.launch import Placement, launch, resolve_run_dir

    skip = ("ray", "actor_cpus", "learner_cpus", "fit_actors")
    if args.print_config:
        return _print_config(_named_layers(args, skip))
    named = _named_layers(args, skip)
    layers = [values for _, values in named]
    given = {key for name, values in named if not name.startswith(_RESUMED) for key in values}
    if {"listen", "remote_actors"} & given:  # a resumed run's own were the launcher's
        raise SeedbedError(
            "seedbed launch opens the learners' listeners itself and counts their actors with "
            "--actors; drop --listen and --remote-actors (remote actors of your own: seedbed train)"
        )
    train = resolve(layers).train  # here --actors counts the Ray actors
    if train.learner_replicas == 1:
        # Every actor is remote: the learner listens (on a cluster, launch widens it with a
        # token). Replicas instead each start their share of the actors on their own node.
        layers.append({"actors": 0, "remote_actors": train.actors, "listen": "127.0.0.1:0"})
    if train.learner_replicas > 1 and args.fit_actors:
        raise SeedbedError(
            "--fit-actors is for remote actors; replicas start their actors on their own nodes"
        )
    layers = resolve_run_dir(layers)  # validates all settings before Ray starts
    gpus = float(train.device == "cuda")
    placement = Placement(
        train.actors,
        args.actor_cpus,
        args.learner_cpus,
        gpus,
        fit_actors=args.fit_actors,
        replicas=train.learner_replicas,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    address = None if args.ray == "local" else args.ray
    return _report(launch(layers, address, placement))


def _eval_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="run a trained policy and report its return",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("path", help="a run directory (its newest checkpoint) or a checkpoint file")
    p.add_argument("--episodes", type=int, default=10, help="episodes to run")
    p.add_argument("--video", metavar="PATH.mp4", default=None, help="record the episodes")
    p.add_argument("--seed", type=int, default=12345, help="seed of the evaluation episodes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device")
    p.add_argument(
        "--plugins",
        default="",
        metavar="MODULE,...",
        help="modules the checkpoint may import (its plug-ins, its env's module); eval refuses "
        "a checkpoint that names others",
    )
    p.set_defaults(command=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from seedbed import evaluate

    plugins = coerce("plugins", args.plugins, tuple[str, ...])
    result = evaluate(args.path, args.episodes, args.video, args.seed, args.device, plugins)
    print(
        f"{result['episodes']} episodes of {result['env']}: return "
        f"{result['mean_return']:.1f} ± {result['std_return']:.1f} "
        f"(min {result['min_return']:.1f}, max {result['max_return']:.1f})"
    )
    if args.video:
        print(f"video: {args.video}")
    return 0


def _actor_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "actor",
        help="act for a learner on another machine (seedbed train --listen)",
        description="Connect to a learner started with --listen and step the environments it "
        "assigns until training is over. The learner sends the env id and its settings.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--connect", required=True, metavar="HOST:PORT", help="the learner's address")
    p.add_argument("--token-file", default=None, help="file holding the learner's token")
    p.add_argument("--tls-ca", default=None, metavar="CERT", help="trust this PEM certificate")
    p.add_argument(
        "--wire",
        choices=("grpc", "socket"),
        default="grpc",
        help="how messages travel: the learner's --wire",
    )
    p.add_argument(
        "--reconnect-for",
        type=float,
        default=60.0,
        metavar="S",
        help="keep retrying a lost learner this many seconds",
    )
    p.set_defaults(command=cmd_actor)


def cmd_actor(args: argparse.Namespace) -> int:
    from seedbed.actor import run_remote_actor
    from seedbed.transport.remote import read_secret

    check_address(args.connect, "--connect")
    token = read_secret(args.token_file, "--token-file")
    tls_ca = read_secret(args.tls_ca, "--tls-ca")
    signal.signal(signal.SIGTERM, _interrupt)
    reason = run_remote_actor(args.connect, token, tls_ca, args.reconnect_for, args.wire)
    print(f"learner at {args.connect}: {reason}")
    return 0


def _plot_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("plot", help="draw a run's learning curve as curve.png")
    p.add_argument("run_dir", help="a run directory")
    p.set_defaults(command=cmd_plot)


def cmd_plot(args: argparse.Namespace) -> int:
    from seedbed.telemetry import plot_curve

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.csv").is_file():
        raise SeedbedError(f"{run_dir} has no metrics.csv; is it a seedbed run directory?")
    target = None
    if (run_dir / "config.yaml").is_file():
        target = load_yaml(run_dir / "config.yaml").get("target_return")
    print(plot_curve(run_dir, target))
    return 0


def _replicate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replicate",
        help="run a Python script as N replicas on this machine (seedbed.replicate)",
        description="Run SCRIPT in N processes, each a replica that Replicator() joins (gloo on "
        "CPUs, NCCL on GPUs). If one fails, all stop and its error is shown. Across machines, "
        "use torchrun instead (see seedbed.replicate).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("-n", "--replicas", type=int, default=2, metavar="N", help="replicas")
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="how long a collective waits"
    )
    p.add_argument("script", help="the Python script each replica runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(command=cmd_replicate)


def cmd_replicate(args: argparse.Namespace) -> int:
    from seedbed.replicate import run_script

    signal.signal(signal.SIGTERM, _interrupt)  # stop the replicas as Ctrl-C does
    run_script(args.script, args.args, args.replicas, args.timeout)
    return 0


def build_parser(shown: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The ``seedbed`` parser; ``shown``: the setting defaults ``--help`` shows (None: each
    setting's built-in one)."""
    parser = argparse.ArgumentParser(
        prog="seedbed",
        description="Fast, cheap reinforcement learning: central inference on PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"seedbed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    _train_parser(subparsers, shown)
    _eval_parser(subparsers)
    _launch_parser(subparsers, shown)
    _actor_parser(subparsers)
    _plot_parser(subparsers)
    _replicate_parser(subparsers)
    return parser


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _preparse(argv: list[str]) -> dict[str, Any] | None:
    """Before the parser is built: import the plug-ins that ``--plugins`` and a ``--config``
    file name (the agents and env families they register bring flags of their own), and, for
    ``--help``, resolve the defaults of the env and agent typed, which it shows.

    Returns:
        Each setting's default for the typed env and agent (None: the command takes no
        settings, or they do not resolve yet, when the full parser's errors say more).
    """
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command not in ("train", "launch"):
        return None  # the other commands take no settings (replicate's script has flags of its own)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("--plugins", "--config", "--env", "--agent"):
        pre.add_argument(name, default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:
        return None  # e.g. --plugins without a value: the full parser says so
    named = load_yaml(known.config).get("plugins") if known.config else None
    for value in (named, known.plugins):
        if value is not None:
            import_plugins(coerce("plugins", value, tuple[str, ...]))
    if not {"-h", "--help"} & set(argv):
        return None
    typed = {k: v for k, v in (("env", known.env), ("agent", known.agent)) if v is not None}
    layers = [load_yaml(known.config)] if known.config else []
    try:
        config = resolve([*layers, typed])
    except SeedbedError:
        return None
    return {k: v for section in _flat(config.to_dict()) for k, v in section.items()}


def _flat(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's settings, then each nested section's (the agent's, the env family's)."""
    run = {k: v for k, v in settings.items() if not isinstance(v, dict)}
    return [run, *(v for v in settings.values() if isinstance(v, dict))]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``seedbed`` command; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        shown = _preparse(argv)
    except SeedbedError as e:
        print(f"seedbed: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser(shown)
    args = parser.parse_args(argv)
    if not hasattr(args, "command"):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.command(args)
    except SeedbedError as e:
        print(f"seedbed: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seedbed: interrupted", file=sys.stderr)
        return 130
