"""The shared types: importable without torch, since actor processes read EnvSpec."""

from __future__ import annotations

from tests.conftest import assert_imports_without


def test_types_envs_and_the_actor_import_without_torch():
    assert_imports_without(("seedbed.actor", "seedbed.envs", "seedbed.types"), ("torch",))
