"""Property tests of the settings parser (``seedbed.config``, ``seedbed.resolve``): whatever
values a YAML file or a flag holds, the parser returns settings or one ``ConfigError`` line,
never another exception."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from seedbed.agents import AGENTS, config_class
from seedbed.config import RunConfig, TrainConfig, build, coerce, fields, load_yaml
from seedbed.envs import families
from seedbed.errors import ConfigError
from seedbed.resolve import resolve

# What YAML and flags can hold: scalars of every kind (NaN, infinities, huge integers, any
# text), and lists and mappings of them.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["none", "1e999", "-1e999", "nan", "inf", "1e3", "0x10", "true", ","])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
# Every setting with its type: the run's, each agent's and each env family's.
SETTINGS = sorted(
    {
        (f.name, str(tp), tp)
        for cls in (
            TrainConfig,
            *(config_class(name) for name in AGENTS),
            *(family.settings_class for family in families()),
        )
        for f, tp in fields(cls)
    },
    key=lambda item: item[:2],
)
# Not drawn with any value: they import the modules they name.
IMPORTING = {"plugins", "env"}
NAMES = sorted({name for name, _, _ in SETTINGS} - IMPORTING)
ENV_IDS = ["CartPole-v1", "Pendulum-v1", "atari:Pong", "ALE/Pong-v5", "dmc:cartpole-balance"]

FAST = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def one_line(error: ConfigError) -> None:
    assert str(error) and "\n" not in str(error), repr(str(error))


@FAST
@given(setting=st.sampled_from(SETTINGS), value=VALUES)
def test_coerce_gives_a_value_or_one_config_error_line(setting, value):
    name, _, tp = setting
    try:
        coerce(name, value, tp)
    except ConfigError as e:
        one_line(e)


@FAST
@given(values=st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8), VALUES, max_size=4))
def test_build_gives_settings_or_one_config_error_line(values):
    try:
        built = build(TrainConfig, values)
    except ConfigError as e:
        one_line(e)
    else:
        assert isinstance(built, TrainConfig)


@FAST
@given(
    layer=st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8), VALUES, max_size=4),
    env=st.none() | st.sampled_from(ENV_IDS),
    agent=st.none() | st.sampled_from(sorted(AGENTS)) | st.text(max_size=6),
)
@example(layer={"total_frames": 1e999}, env=None, agent=None)
@example(layer={"lr": float("nan"), "actors": "1e999"}, env=None, agent=None)
def test_resolve_gives_a_config_or_one_config_error_line(layer, env, agent):
    layer = {k: v for k, v in layer.items() if k not in IMPORTING}
    if env is not None:
        layer["env"] = env
    if agent is not None:
        layer["agent"] = agent
    try:
        config = resolve([layer])
    except ConfigError as e:
        one_line(e)
    else:
        assert isinstance(config, RunConfig)
        assert dataclasses.asdict(config.train)  # whole settings


@FAST
@given(data=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
@example(data=b"\xff\xfe\x00bad")
@example(data=b"[1, 2]")
@example(data=b"a: [unclosed")
def test_load_yaml_gives_a_mapping_or_one_config_error_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_bytes(data)
    try:
        assert isinstance(load_yaml(path), dict)
    except ConfigError as e:
        one_line(e)


def test_load_yaml_of_a_folder_is_one_config_error_line(tmp_path):
    try:
        load_yaml(tmp_path)
    except ConfigError as e:
        one_line(e)
        assert "cannot be read" in str(e)
    else:
        raise AssertionError("a folder read as a config file")
