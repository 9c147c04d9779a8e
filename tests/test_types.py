"""What must import without torch: the shared types (actor processes read EnvSpec), the actor,
envs, and the CLI as far as `seedbed train --help`."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import assert_imports_without


def test_types_envs_and_the_actor_import_without_torch():
    assert_imports_without(("seedbed.actor", "seedbed.envs", "seedbed.types"), ("torch",))


def test_reading_the_train_help_imports_no_torch():
    # A user's first command: `seedbed train --help` must answer at once, without torch.
    code = (
        "import contextlib, io, sys\n"
        "from seedbed.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    main(['train', '--help'])\n"
        "assert '--total-frames' in out.getvalue(), out.getvalue()[:200]\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
