"""The documentation site builds with ``--strict`` (no broken link, anchor or API reference), its
settings reference lists every setting of ``seedbed train``, and the README's example runs."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One build serves every test here: the group keeps them on one pytest-xdist worker.
pytestmark = [pytest.mark.docs, pytest.mark.xdist_group("docs")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from this checkout into a temporary folder (never the repo's site/)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra has it)")
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
        "NO_MKDOCS_2_WARNING": "1",  # Material's banner about MkDocs 2
    }
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-5000:]}"
    return out


def test_site_builds(site: Path) -> None:
    for page in ("index.html", "reference/settings/index.html", "reference/api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    assert "seedbed.train" in api and "Replicator" in api  # mkdocstrings rendered the docstrings


def _all_settings() -> dict[str, type]:
    """Every settings dataclass of ``seedbed train``, found as the CLI finds them, by the id
    of its section in the settings reference."""
    from seedbed.agents import AGENTS, config_class
    from seedbed.config import TrainConfig
    from seedbed.envs import families

    classes: dict[str, type] = {"run-settings": TrainConfig}
    classes.update(
        {f.name: f.settings_class for f in families() if dataclasses.fields(f.settings_class)}
    )
    classes.update({name: config_class(name) for name in AGENTS})
    return classes


def _section(page: str, anchor: str) -> str:
    """The text of the section of ``page`` whose heading has id ``anchor``, up to the next."""
    start = page.index(f'id="{anchor}"')
    end = re.compile(r"<h[23][ >]").search(page, start)
    text = re.sub(r"<[^>]+>", "", page[start : end.start() if end else None])
    return html.unescape(text)


def test_every_setting_is_in_the_reference(site: Path) -> None:
    page = (site / "reference/settings/index.html").read_text(encoding="utf-8")
    missing = []
    for anchor, cls in _all_settings().items():
        assert f'id="{anchor}"' in page, f"no section for {cls.__name__} in the reference"
        text = _section(page, anchor)
        for f in dataclasses.fields(cls):
            help_start = f.metadata.get("help", "").split("`")[0][:40]  # before any code span
            if f"--{f.name.replace('_', '-')}" not in text or help_start not in text:
                missing.append(f"--{f.name.replace('_', '-')} ({cls.__name__})")
    assert not missing, f"not in the settings reference: {missing}"


@pytest.mark.slow
def test_readme_example_runs(tmp_path: Path) -> None:
    """The README's Python example, run as a script, for real: only its frame budget is cut,
    so it trains and evaluates in seconds rather than reaching its target."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 15_000, "README.md is a front page: at most 15 KB"
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README.md has no Python example"
    budget = re.compile(r"total_frames=[0-9_]+")
    assert budget.search(blocks[0]), "the README's example sets no total_frames"
    script = tmp_path / "example.py"
    script.write_text(budget.sub("total_frames=20_000", blocks[0]))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trained, evaluated = (float(x) for x in done.stdout.split()[-2:])  # what it prints
    assert trained > 0 and evaluated > 0  # CartPole pays 1 a step
