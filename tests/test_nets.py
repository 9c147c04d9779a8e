"""Network shapes for every torso, with and without the LSTM core, and mixed precision."""

from __future__ import annotations

import pytest
import torch

from seedbed.errors import ConfigError
from seedbed.nets import _scaled, make_actor_critic
from seedbed.types import EnvSpec

ATARI = EnvSpec("atari:Pong", (4, 84, 84), "uint8", 6, frame_skip=4)
VECTOR = EnvSpec("CartPole-v1", (4,), "float32", 2)


def inputs(spec: EnvSpec, steps: int, batch: int):
    if spec.obs_dtype == "uint8":
        obs = torch.randint(0, 256, (steps, batch, *spec.obs_shape), dtype=torch.uint8)
    else:
        obs = torch.randn(steps, batch, *spec.obs_shape)
    done = torch.zeros(steps, batch, dtype=torch.bool)
    done[0] = True
    return obs, torch.zeros(steps, batch, dtype=torch.int64), torch.zeros(steps, batch), done


@pytest.mark.parametrize("torso", ["nature", "a3c", "impala"])
@pytest.mark.parametrize("lstm_size", [None, 32])
def test_image_torsos_give_logits_values_and_state(torso, lstm_size):
    net = make_actor_critic(ATARI, (), lstm_size, shared_torso=True, torso=torso)
    state = net.initial_state(3)
    logits, values, new_state = net(*inputs(ATARI, 5, 3), state)
    assert logits.shape == (5, 3, 6) and values.shape == (5, 3)
    assert logits.dtype == values.dtype == torch.float32
    if lstm_size:
        assert [s.shape for s in new_state] == [(3, lstm_size), (3, lstm_size)]
    else:
        assert new_state == ()


@pytest.mark.parametrize("shared_torso", [True, False])
@pytest.mark.parametrize("lstm_size", [None, 8])
def test_acting_without_values_gives_the_same_policy(shared_torso, lstm_size):
    net = make_actor_critic(VECTOR, (16,), lstm_size, shared_torso=shared_torso)
    args = (*inputs(VECTOR, 3, 4), net.initial_state(4))
    logits, values, state = net(*args)
    policy_only, none, same_state = net(*args, values=False)
    assert none is None and values.shape == (3, 4)
    torch.testing.assert_close(policy_only, logits, rtol=0, atol=0)
    for a, b in zip(state, same_state, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_torsos_differ_as_published():
    nature = make_actor_critic(ATARI, (), None, torso="nature")
    impala = make_actor_critic(ATARI, (), None, torso="impala")
    a3c = make_actor_critic(ATARI, (), None, torso="a3c")
    assert nature.torso.out_size == 512 and impala.torso.out_size == a3c.torso.out_size == 256
    layers = [
        (c.out_channels, c.kernel_size, c.stride)
        for c in nature.torso.convs
        if isinstance(c, torch.nn.Conv2d)
    ]
    assert layers == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    layers = [
        (c.out_channels, c.kernel_size, c.stride)
        for c in a3c.torso.convs
        if isinstance(c, torch.nn.Conv2d)
    ]
    assert layers == [(16, (8, 8), (4, 4)), (32, (4, 4), (2, 2))]
    assert a3c.torso.fc[0].in_features == 32 * 9 * 9  # 84 -> 20 -> 9
    convs = [m for m in impala.torso.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 5 + [32] * 5


def test_image_torsos_keep_the_parameter_names_of_earlier_checkpoints():
    # Checkpoints name parameters by their place in the torso's Sequential: moving a layer
    # without parameters (the last ReLU went after the flatten) must not shift the others.
    a3c = make_actor_critic(ATARI, (), None, torso="a3c").torso.state_dict()
    assert list(a3c) == [
        f"{m}.{k}" for m in ("convs.0", "convs.2", "fc.0") for k in ("weight", "bias")
    ]
    nature = make_actor_critic(ATARI, (), None, torso="nature").torso.state_dict()
    names = ("convs.0", "convs.2", "convs.4", "fc.0")
    assert list(nature) == [f"{m}.{k}" for m in names for k in ("weight", "bias")]
    impala = list(make_actor_critic(ATARI, (), None, torso="impala").torso.state_dict())
    assert impala[:3] == ["stacks.0.weight", "stacks.0.bias", "stacks.2.conv0.weight"]
    assert impala[-4:] == [
        "stacks.11.conv1.weight",
        "stacks.11.conv1.bias",
        "fc.0.weight",
        "fc.0.bias",
    ]


def test_mlp_on_vectors_and_image_torso_refused_for_vectors():
    net = make_actor_critic(VECTOR, (16,), None, torso="mlp")
    logits, values, _ = net(*inputs(VECTOR, 2, 4), ())
    assert logits.shape == (2, 4, 2) and values.shape == (2, 4)
    with pytest.raises(ConfigError, match="--torso nature needs image observations"):
        make_actor_critic(VECTOR, (16,), None, torso="nature")


def test_bfloat16_torso_keeps_heads_and_gradients_float32():
    torch.manual_seed(0)
    exact = make_actor_critic(ATARI, (), None, torso="nature")
    mixed = make_actor_critic(ATARI, (), None, torso="nature", torso_dtype=torch.bfloat16)
    mixed.load_state_dict(exact.state_dict())
    batch = inputs(ATARI, 2, 8)
    logits, values, _ = mixed(*batch, ())
    assert logits.dtype == values.dtype == torch.float32
    reference, _, _ = exact(*batch, ())
    assert torch.allclose(logits, reference, atol=0.05)  # bfloat16 keeps ~3 significant digits
    logits.sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in mixed.parameters() if p.grad is not None)


def test_uint8_frames_become_the_autocast_dtype_directly():
    """Under bfloat16 autocast frames skip float32 and reach the torso as the same bfloat16
    values the convolution would have cast float32 frames to."""
    frames = torch.arange(256, dtype=torch.uint8)
    assert _scaled(frames).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scaled = _scaled(frames)
    assert scaled.dtype == torch.bfloat16
    assert torch.equal(scaled, (frames.float() / 255).to(torch.bfloat16))


def test_image_networks_start_near_uniform_with_features_that_see_the_input():
    torch.manual_seed(0)
    net = make_actor_critic(ATARI, (), None, torso="nature")
    obs, *rest = inputs(ATARI, 1, 16)
    logits, _, _ = net(obs, *rest, ())
    assert (logits.softmax(-1) - 1 / 6).abs().max() < 0.02
    features = net.torso(obs[0])
    assert (features.std(0) > 0).float().mean() > 0.5  # most units respond to the frames


def test_football_torso_is_seeds_four_stack_resnet():
    smm = EnvSpec("football:academy_empty_goal_close", (16, 72, 96), "uint8", 19)
    net = make_actor_critic(smm, (), None, shared_torso=True, torso="football")
    convs = [m for m in net.torso.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 15
    assert net.torso.fc[0].in_features == 32 * 5 * 6 and net.torso.out_size == 256
    obs, actions, rewards, done = inputs(smm, 2, 3)
    obs = torch.zeros_like(obs)
    obs[..., ::4, 30:34, 40:44] = 255  # sparse 0/255 planes, as the Super Mini Map's
    logits, values, _ = net(obs, actions, rewards, done, ())
    assert logits.shape == (2, 3, 19) and values.shape == (2, 3)
    assert values.abs().max() < 0.5  # the value head starts near zero (nets.FootballResNet)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepared_observations_reach_the_torso_as_normalizing_each_pass_would(dtype):
    """A learner that prepares a batch once (normalized, in the torso's dtype) gets the outputs
    that normalizing in every pass gives: the torso sees the values autocast would cast to."""
    torch.manual_seed(0)
    net = make_actor_critic(ATARI, (), None, torso="nature", normalize_obs=True, torso_dtype=dtype)
    obs, *rest = inputs(ATARI, 3, 4)
    net.obs_norm.update(obs)
    prepared = net.prepare(obs)
    assert prepared.dtype == dtype
    # In the torso's layout, and its minibatches too, so that no pass copies them again.
    minibatch = prepared[:, torch.tensor([2, 0])].reshape(-1, *ATARI.obs_shape)
    assert minibatch.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        logits, values, _ = net(obs, *rest, ())
        again, values_again, _ = net(prepared, *rest, (), prepared=True)
    assert torch.equal(logits, again) and torch.equal(values, values_again)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=dtype != torch.float32):
        from_float32 = net.torso(net.obs_norm(obs.flatten(0, 1)))  # autocast casts the input
        from_prepared = net.torso(prepared.flatten(0, 1))
    assert torch.equal(from_float32, from_prepared)
