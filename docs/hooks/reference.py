"""MkDocs hook: the settings and CLI reference pages, generated from the code at build time.

Every setting of ``seedbed train`` is a field of a config dataclass (the run's ``TrainConfig``,
each env family's settings, each agent's config) whose metadata carries its help text, and the
defaults per env family and agent are YAML files in ``seedbed.presets``. These pages are built
from those, and the CLI page from the parser itself, so a new setting, family, agent, preset or
command documents itself: nothing here lists one by hand. ``tests/test_docs.py`` checks it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

SETTINGS_PAGE = "reference/settings.md"
CLI_PAGE = "reference/cli.md"


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (they exist only in the build, never in git)."""
    from mkdocs.structure.files import File

    for page, text in ((SETTINGS_PAGE, settings_markdown()), (CLI_PAGE, cli_markdown())):
        files.append(File.generated(config, page, content=text))
    return files


def settings_markdown() -> str:
    """The settings reference: every run, env-family and agent setting, and the presets."""
    from seedbed.agents import AGENTS, config_class
    from seedbed.config import TrainConfig
    from seedbed.envs import families

    out = [
        "# Settings",
        "",
        "Every setting of `seedbed train` (and `seedbed launch`), generated from the config "
        "dataclasses. A setting is a flag (`--total-frames`), a key of a `--config` YAML file "
        "(`total_frames`) and a keyword of `seedbed.train(...)`. Later layers win: the built-in "
        "default below, then the [preset](#presets) of the env's family and agent, then "
        "`--config FILE.yaml`, then flags. `seedbed train --env ID [--agent A] --print-config` "
        "prints a run's settings, each with where its value came from.",
        "",
        "An env family's and an agent's settings may also sit in a YAML section named after "
        "it (`atari:`, `ppo:`), as the run's saved `config.yaml` holds them. Boolean flags "
        "take a `--no-` form; `none` (or `null`, `off`) clears a setting whose type allows it.",
        "",
        "## Run settings",
        "",
        _doc(TrainConfig),
        "",
        *_table(TrainConfig),
        "",
        "## Environment family settings",
        "",
    ]
    for family in families():
        if not dataclasses.fields(family.settings_class):
            continue  # no settings: no flags, no section
        ids = f"`{family.prefix}` ids" if family.prefix else "its ids"
        out += [f"### {family.name}", "", f"For {ids}; YAML section `{family.name}:`."]
        out += ["", _doc(family.settings_class), "", *_table(family.settings_class), ""]
    without = [f.name for f in families() if not dataclasses.fields(f.settings_class)]
    out += [f"Families without settings of their own: {', '.join(without)}.", ""]
    out += [
        "## Agent settings",
        "",
        "Chosen with `--agent`; YAML section named after the agent.",
        "",
    ]
    for name in AGENTS:
        cls = config_class(name)
        out += [f"### {name}", "", f"`{cls.__module__}.{cls.__name__}`: {_doc(cls)}", ""]
        out += [*_table(cls), ""]
    return "\n".join(out + _presets())


def _doc(cls: type) -> str:
    """A settings class's docstring as one paragraph (its first one)."""
    text = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in text.splitlines())


def _table(cls: type) -> list[str]:
    from seedbed.config import fields, flag

    rows = ["| flag | type | default | help |", "|---|---|---|---|"]
    for f, tp in fields(cls):
        name = f"`--{flag(f.name)}`" + (f"<br>`--no-{flag(f.name)}`" if tp is bool else "")
        help_text = _escape(f.metadata.get("help", ""))
        rows.append(f"| {name} | {_type(tp)} | {_value(f.default)} | {help_text} |")
    return rows


def _type(tp: Any) -> str:
    """A field's type as a reader would write it: ``int``, ``float | none``, a choice."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"list of {_type(typing.get_args(tp)[0])} (comma-separated)"
    return getattr(tp, "__name__", str(tp))


def _value(value: Any) -> str:
    """A default or preset value as a flag would spell it."""
    if value is None:
        return "`none`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple | list):
        return f"`{','.join(map(str, value))}`" if value else "(empty)"
    return f"`{value}`"


def _escape(text: str) -> str:
    """``text`` safe in a Markdown table cell: pipes and stars escaped outside code spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside backticks
        parts[i] = parts[i].replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")
    return "`".join(parts)


def _presets() -> list[str]:
    """One table per row of preset files: what each changes over the built-in defaults."""
    from seedbed.presets import FOLDER

    out = [
        "## Presets",
        "",
        "What each env family's row of presets changes over the built-in defaults above, from "
        "the files in `src/seedbed/presets/`: `ROW.yaml` applies to every run of the row "
        "(its `agent` is the default one), `ROW/AGENT.yaml` to runs of that agent only. The "
        "row is the family's name; Gymnasium's ids take `mujoco` for MuJoCo tasks, "
        "`continuous` for other ids with continuous actions, else `classic`. An agent without "
        "a file keeps its built-in defaults.",
        "",
    ]
    for row_file in sorted(FOLDER.glob("*.yaml")):
        row = row_file.stem
        files = [row_file, *sorted((FOLDER / row).glob("*.yaml"))]
        values = [_load(path) for path in files]
        names = list(dict.fromkeys(k for v in values for k in v))
        heads = [f"`{p.relative_to(FOLDER)}`" for p in files]
        out += [f"### {row}", "", "| setting | " + " | ".join(heads) + " |"]
        out.append("|---" * (len(files) + 1) + "|")
        for name in names:
            cells = [_value(v[name]) if name in v else "" for v in values]
            out.append(f"| `{name}` | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _load(path: Path) -> dict[str, Any]:
    from seedbed.presets import load_preset

    return load_preset(path)


def cli_markdown() -> str:
    """The CLI reference: ``seedbed --help`` and each command's, as the parser prints them."""
    from seedbed.cli import build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    out = [
        "# Command line",
        "",
        "The `seedbed` command's help, as it prints it. The settings that `train` and `launch` "
        "take are described, with their types and defaults, in [Settings](settings.md).",
        "",
        "## seedbed",
        "",
        *_help(parser),
    ]
    for name, sub in commands.items():
        out += ["", f"## seedbed {name}", "", *_help(sub, collapse=name in ("train", "launch"))]
    return "\n".join(out) + "\n"


def _subcommands(parser: Any) -> dict[str, Any]:
    import argparse

    for action in parser._actions:  # argparse keeps no public list of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: Any, collapse: bool = False) -> list[str]:
    with _columns(100):
        text = parser.format_help().rstrip()
    block = ["```text", *text.splitlines(), "```"]
    if not collapse:
        return block
    # Their help lists every setting: folded, so the page stays a map of the commands.
    return ['??? note "Full help (every setting)"', "", *("    " + line for line in block)]


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse wraps help to $COLUMNS: a fixed width gives the same page on every machine."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
