"""Policy broadcasts: int8 and fp16 payloads act like the fp32 policy, shrink, and bad bytes are
refused with one-line errors."""

from __future__ import annotations

import copy
import json
import re
import struct
import warnings
import zlib

import pytest
import torch
from torch import nn
from torch.ao.nn.intrinsic.quantized import dynamic as nniqd
from torch.ao.nn.quantized import dynamic as nnqd
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

from seedbed.errors import SeedbedError
from seedbed.nets import make_actor_critic
from seedbed.quantize import (
    PRECISIONS,
    decode_policy,
    encode_policy,
    policy_error,
    quantize_for_inference,
)
from seedbed.types import EnvSpec, StepInput

CARTPOLE = EnvSpec("CartPole-v1", (4,), "float32", 2)
FRAMES = EnvSpec("atari:Pong", (4, 44, 44), "uint8", 6)  # small frames keep the tests fast
HIGH = torch.tensor([2.4, 2.0, 0.21, 3.0])  # CartPole's observation ranges: position, velocity,
# pole angle, angular velocity; their scales differ tenfold, as real observations do


def cartpole_obs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 4, generator=g) * 2 - 1) * HIGH


def probe(net: nn.Module, obs: torch.Tensor) -> tuple:
    """The forward's arguments for time-major ``obs`` [T, B, ...], episodes starting at t = 0."""
    steps, batch = obs.shape[:2]
    done = torch.zeros(steps, batch, dtype=torch.bool)
    done[0] = True
    actions = torch.randint(0, net.num_actions, (steps, batch), generator=torch.Generator())
    return obs, actions, torch.randn(steps, batch), done, net.initial_state(batch)


def forward(net: nn.Module, *args) -> tuple:
    """The network's own call, for ``policy_error`` (which the runtime gives an agent's
    ``acting_outputs``)."""
    return net(*args)


def outputs(net: nn.Module, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits, values, _ = net(*args)
    return logits, values


def train_to_teacher(steps: int = 300) -> nn.Module:
    """An MLP actor-critic regressed onto a fixed random teacher's logits and value, so its
    actions have margins as a trained policy's do; the teacher is odd (tanh, no biases), so
    both actions are about equally frequent."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(4, 32, bias=False), nn.Tanh(), nn.Linear(32, 3, bias=False))
    net = make_actor_critic(CARTPOLE, (128, 128, 128), None)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for step in range(steps):
        obs = cartpole_obs(256, step)
        with torch.no_grad():
            target = 5 * teacher(obs / HIGH)
        logits, values = net(*probe(net, obs[None]))[:2]
        loss = (logits[0] - target[:, :2]).square().mean()
        loss = loss + (values[0] - target[:, 2]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net.requires_grad_(False)


@pytest.fixture(scope="module")
def trained() -> nn.Module:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a net this small trains fastest on one thread, busy machine or not
    try:
        return train_to_teacher()
    finally:
        torch.set_num_threads(threads)


def broadcast(net: nn.Module, precision: str, version: int = 0) -> nn.Module:
    return decode_policy(encode_policy(net, precision, version), net)[0]


def test_int8_policy_picks_the_fp32_action(trained):
    args = probe(trained, cartpole_obs(4096, seed=10_000)[None])
    logits, _ = outputs(trained, args)
    actions = logits.argmax(-1)
    assert 0.3 < actions.float().mean() < 0.7  # a policy that does not always pick one action
    assert (logits[..., 0] - logits[..., 1]).abs().median() > 0.2  # nor one of near-ties
    int8_logits, _ = outputs(broadcast(trained, "int8"), args)
    assert (int8_logits.argmax(-1) == actions).float().mean() >= 0.95


@pytest.mark.parametrize("precision, tolerance", [("int8", 0.05), ("fp16", 0.001)])
def test_outputs_agree_within_a_share_of_their_scale(trained, precision, tolerance):
    args = probe(trained, cartpole_obs(1024, seed=10_001)[None])
    for reference, output in zip(
        outputs(trained, args), outputs(broadcast(trained, precision), args), strict=True
    ):
        scale = reference.abs().max()
        assert 0 < (output - reference).abs().max() <= tolerance * scale


def test_policy_error_is_zero_for_fp32_and_small_for_int8(trained):
    args = probe(trained, cartpole_obs(1024, seed=10_002)[None])
    scale = max(t.abs().max() for t in outputs(trained, args))
    assert policy_error(trained, broadcast(trained, "fp32"), forward, args) == 0.0
    assert 0 < policy_error(trained, broadcast(trained, "int8"), forward, args) <= 0.05 * scale


def test_payloads_of_the_3x512_mlp_shrink():
    net = make_actor_critic(CARTPOLE, (512, 512, 512), None)
    size = {precision: len(encode_policy(net, precision, 0)) for precision in PRECISIONS}
    assert size["int8"] <= 0.30 * size["fp32"]
    assert size["fp16"] <= 0.55 * size["fp32"]


def test_int8_weights_are_exactly_what_quantize_dynamic_makes():
    """Our fast quantizer against PyTorch's own (observer, quantized tensor), byte for byte: rows
    of very different scales, an all-zero row, and values exactly half-way between two steps
    (which round to even)."""
    torch.manual_seed(0)
    net = make_actor_critic(CARTPOLE, (256, 256, 256), None).requires_grad_(False)
    weight = net.torso.layers[2].weight
    weight.mul_(torch.logspace(-3, 2, len(weight))[:, None])
    weight[7] = 0.0
    halves = torch.arange(weight.shape[1]) % 7 - 3.5  # k + 0.5 steps of 2^-4: exact in float32
    halves[0] = 127.5
    weight[9] = halves / 16
    ours = broadcast(net, "int8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        reference = quantize_dynamic(
            copy.deepcopy(net), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
        )
    checked = 0
    for name, module in ours.named_modules():
        if isinstance(module, nnqd.Linear):
            got, want = module.weight(), reference.get_submodule(name).weight()
            assert torch.equal(got.int_repr(), want.int_repr()), name
            assert torch.equal(got.q_per_channel_scales(), want.q_per_channel_scales()), name
            assert not got.q_per_channel_zero_points().any()
            checked += 1
    assert checked == 2  # the torso's 2nd and 3rd layers (the 1st reads raw observations)


def test_fp32_round_trip_is_exact_and_carries_the_version():
    net = make_actor_critic(CARTPOLE, (64,), 32)
    decoded, version = decode_policy(encode_policy(net, "fp32", 41), net)
    assert version == 41 and decoded is not net and not decoded.training
    for (name, a), (_, b) in zip(
        net.state_dict().items(), decoded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert not any(p.requires_grad for p in decoded.parameters())


def test_actors_hold_exactly_the_int8_weights_central_inference_uses():
    net = make_actor_critic(CARTPOLE, (128, 128, 128), None)
    actor, central = broadcast(net, "int8"), quantize_for_inference(net, "int8")
    for name in ("torso.layers.2", "torso.layers.4"):
        a, c = actor.get_submodule(name).weight(), central.get_submodule(name).weight()
        assert type(actor.get_submodule(name)) is nniqd.LinearReLU
        assert a.qscheme() == torch.per_channel_affine
        assert torch.equal(a.int_repr(), c.int_repr())
        assert torch.equal(a.q_per_channel_scales(), c.q_per_channel_scales())
    # the layer reading raw observations, and the heads, too small to gain from int8
    for name in ("torso.layers.0", "policy", "value"):
        assert type(actor.get_submodule(name)) is nn.Linear
    args = probe(net, cartpole_obs(64, seed=3)[None])
    assert all(map(torch.equal, outputs(actor, args), outputs(central, args)))


def test_int8_hidden_layers_fuse_their_relu_exactly():
    """Each int8 layer a ReLU follows runs fbgemm's fused linear+ReLU, and its ReLU becomes an
    Identity: the outputs are bit for bit those of the int8 linear and a separate ReLU, and a
    layer no ReLU follows (the heads, here made int8-sized) stays unfused."""
    net = make_actor_critic(CARTPOLE, (256, 256, 256), None)
    net.policy = nn.Linear(256, 128)  # large enough for int8; no ReLU after it
    int8 = broadcast(net, "int8")
    layers = int8.torso.layers
    assert [type(m) for m in layers] == [
        nn.Linear,
        nn.ReLU,
        nniqd.LinearReLU,
        nn.Identity,
        nniqd.LinearReLU,
        nn.Identity,
    ]
    assert type(int8.policy) is nnqd.Linear
    x = torch.relu(layers[0](cartpole_obs(64, seed=6)))
    for fused in (layers[2], layers[4]):
        packed = fused._packed_params._packed_params
        separate = torch.relu(torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True))
        y = fused(x)
        assert torch.equal(y, separate) and (y == 0).any()
        x = y


def test_lstm_core_is_quantized_and_stays_close_over_an_unroll():
    net = make_actor_critic(CARTPOLE, (64,), 64)
    int8 = broadcast(net, "int8")
    assert type(int8.core.cell) is nnqd.LSTMCell
    args = probe(net, cartpole_obs(20 * 16, seed=4).view(20, 16, 4))
    assert 0 < policy_error(net, int8, forward, args) < 0.05


@pytest.mark.parametrize("torso", ["nature", "a3c", "impala"])
def test_conv_torsos_keep_float_convolutions(torso):
    net = make_actor_critic(FRAMES, (), None, torso=torso)
    int8 = broadcast(net, "int8")
    assert type(int8.torso.fc[0]) is nniqd.LinearReLU
    convs = [name for name, m in net.named_modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(
        torch.equal(net.get_submodule(n).weight, int8.get_submodule(n).weight) for n in convs
    )
    frames = torch.randint(0, 256, (1, 8, *FRAMES.obs_shape), dtype=torch.uint8)
    args = probe(net, frames)
    scale = max(t.abs().max() for t in outputs(net, args))
    assert 0 < policy_error(net, int8, forward, args) < 0.1 * scale


def test_int8_runs_a_bfloat16_torso_in_float32():
    net = make_actor_critic(CARTPOLE, (256, 256), None, torso_dtype=torch.bfloat16)
    int8 = broadcast(net, "int8")
    assert int8.torso_dtype == torch.float32 and net.torso_dtype == torch.bfloat16
    assert type(int8.torso.layers[2]) is nniqd.LinearReLU
    assert policy_error(net, int8, forward, probe(net, cartpole_obs(32, seed=5)[None])) < 0.05


def reheadered(payload: bytes, edit, extra: bytes = b"") -> bytes:
    """``payload`` with its JSON header changed by ``edit`` (and ``extra`` bytes appended),
    with a valid checksum, so only the header's content is wrong."""
    magic, form, size, _ = struct.unpack_from("<4sB3xII", payload)
    header = json.loads(payload[16 : 16 + size])
    edit(header)
    text = json.dumps(header).encode()
    body = text + payload[16 + size :] + extra
    return struct.pack("<4sB3xII", magic, form, len(text), zlib.crc32(body)) + body


def huge(header):
    header["arrays"][0][2] = [10**12, 4]


def corrupt(payload: bytes) -> bytes:
    return payload[:-5] + bytes([payload[-5] ^ 1]) + payload[-4:]


BAD = {
    "empty": (lambda p: b"", "truncated"),
    "cut in the prefix": (lambda p: p[:10], "truncated"),
    "cut in the arrays": (lambda p: p[:-100], "checksum"),
    "flipped bit": (corrupt, "corrupted"),
    "not ours": (lambda p: b"PK\x03\x04" + p[4:], "not a seedbed policy payload"),
    "newer format": (lambda p: p[:4] + b"\x09" + p[5:], "format 9"),
    "huge array": (lambda p: reheadered(p, huge), "'torso.layers.0.weight' float32 [1000000000000"),
    "bad version": (lambda p: reheadered(p, lambda h: h.update(version=-1)), "version -1"),
    "no header": (lambda p: reheadered(p, lambda h: h.clear()), "header unreadable"),
    "extra bytes": (lambda p: reheadered(p, lambda h: None, b"\0" * 8), "bytes of arrays"),
}


@pytest.mark.parametrize("damage, message", BAD.values(), ids=BAD.keys())
def test_bad_payloads_raise_one_line_errors(damage, message):
    net = make_actor_critic(CARTPOLE, (16,), None)
    with pytest.raises(SeedbedError, match=re.escape(message)) as error:
        decode_policy(damage(encode_policy(net, "int8", 3)), net)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("lstm", [None, 8])
def test_a_payload_for_another_network_is_refused(lstm):
    payload = encode_policy(make_actor_critic(CARTPOLE, (32,), None), "fp16", 1)
    other = make_actor_critic(CARTPOLE, (32, 32) if lstm is None else (32,), lstm)
    with pytest.raises(SeedbedError, match="for another network: array") as error:
        decode_policy(payload, other)
    assert "\n" not in str(error.value)


def test_a_broadcast_leaves_out_what_acting_never_reads():
    from seedbed.agents.vtrace.learning import VTraceAgent

    torch.manual_seed(0)
    net = make_actor_critic(CARTPOLE, (512, 512, 512), None, shared_torso=False)
    skip = VTraceAgent.acting_skips
    for precision in PRECISIONS:
        payload = encode_policy(net, precision, 2, skip)
        names = [entry[0] for entry in _header(payload)["arrays"]]
        assert names and not any(n.startswith(("value_torso.", "value.")) for n in names)
        assert len(payload) < 0.51 * len(encode_policy(net, precision, 2))  # half: no value torso
        decoded = decode_policy(payload, net, skip)[0]
        args = (*probe(net, cartpole_obs(64, 1)[None]), False)  # acting's call: no values
        assert policy_error(net, decoded, forward, args) <= (0.0 if precision == "fp32" else 0.1)
    # Both ends must agree on what is left out.
    with pytest.raises(SeedbedError, match="for another network") as error:
        decode_policy(encode_policy(net, "int8", 2, skip), net)
    assert "\n" not in str(error.value)


def test_a_d4pg_broadcast_carries_the_policy_alone():
    from seedbed.agents import make_agent
    from seedbed.envs import make_spec
    from seedbed.resolve import resolve

    spec = make_spec("dmc:cartpole-balance")  # 5 observations, 1 action in [-1, 1]
    config = resolve([{"env": "dmc:cartpole-balance", "agent": "d4pg"}]).agent
    agent = make_agent("d4pg", spec, config, "cpu")
    payload = encode_policy(agent.network, "int8", 1, agent.acting_skips)
    policy_bytes = 4 * sum(p.numel() for p in agent.network.policy.parameters())
    assert len(payload) < 0.5 * policy_bytes  # int8 policy weights, no critic
    decoded = decode_policy(payload, agent.network, agent.acting_skips)[0]
    ids, done = torch.arange(32), torch.zeros(32, dtype=torch.bool)
    step = StepInput(torch.randn(32, 5), torch.zeros(32, 1), torch.zeros(32), done, ids)
    error = policy_error(agent.network, decoded, agent.acting_outputs, (step, ()))
    assert 0 < error < 0.2  # actions in [-1, 1]


def _header(payload: bytes) -> dict:
    prefix = struct.Struct("<4sB3xII")  # magic, format, header bytes, CRC-32
    size = prefix.unpack_from(payload)[2]
    return json.loads(payload[prefix.size : prefix.size + size])


@pytest.mark.parametrize("lstm", [None, 256])
def test_decoding_into_the_last_policy_updates_it_in_place(lstm):
    torch.manual_seed(0)
    net = make_actor_critic(CARTPOLE, (256, 256), lstm, shared_torso=False)
    skip = ("value_torso", "value")
    args = (*probe(net, cartpole_obs(32, 2)[None]), False)
    acting = None
    for version, precision in enumerate(["int8", "int8", "fp16", "fp32", "int8"]):
        with torch.no_grad():
            for p in net.parameters():
                p.mul_(0.9)  # a new policy each time
        payload = encode_policy(net, precision, version, skip)
        fresh = decode_policy(payload, net, skip)[0]
        previous = acting
        acting, decoded_version = decode_policy(payload, net, skip, into=acting)
        assert decoded_version == version
        assert policy_error(fresh, acting, forward, args) == 0.0  # as a fresh decode
        # In place while the form (int8 or float) stays; a new module when it changes.
        same_form = version in (1, 3)
        assert (acting is previous) == same_form, (version, precision)
