"""Properties of what the learner takes from actors, over inputs Hypothesis makes up: any bytes,
any step message and any well-formed step either are accepted exactly as valid or refused with
a reason, and never crash the learner (the decoder, the inference server, a real gateway)."""

from __future__ import annotations

import asyncio
import math

import grpc
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from seedbed.actor.local import acted_fields
from seedbed.agents import make_agent
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport.address import check_address
from seedbed.transport.base import Request
from seedbed.transport.checks import MAX_ABS_REWARD
from seedbed.transport.inprocess import InProcessServer
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote import PROTOCOL, GrpcActorClient, Placement, Refused
from seedbed.transport.remote.client import redirect_target
from seedbed.transport.remote.framing import HEADER, FrameProtocol, TooLarge, framed
from seedbed.transport.remote.wire import Assignment, Malformed, StepDecoder, parse
from seedbed.types import EnvSpec
from tests.transport import test_remote
from tests.transport.test_remote import TOKEN, _hello, _raw_stream, steps

learner = test_remote.learner  # the fixture: a real gateway over real shared memory

E = 2
ACTED = (("action", (), "int64"), ("version", (), "int64"), ("logits", (2,), "<f4"))
LOCAL = {"agent": "vtrace", "agent_config": {}, "num_envs": E, "first_env": 0, "acted": ACTED}
ASSIGNMENT = Assignment("CartPole-v1", E, 0, None, 0, "<f4", (3,), local=LOCAL)
WANTED = {
    "obs": ("<f4", (E, 3)),
    "reward": ("<f4", (E,)),
    "done": ("|b1", (E,)),
    "truncated": ("|b1", (E,)),
    **{name: (np.dtype(d).str, (E, *s)) for name, s, d in ACTED},
}


@given(st.binary(max_size=2048))
def test_any_bytes_are_a_message_or_refused_with_a_reason(data):
    message = parse(data, limit=1024)
    if isinstance(message, Malformed):
        assert message.error
    else:
        assert isinstance(message, pb.ActorMessage) and len(data) <= 1024


def arrays(name: str) -> st.SearchStrategy[pb.Array]:
    """Arrays as the field ``name`` wants them, or a little off in dtype, shape or size."""
    dtype, shape = WANTED[name]
    size = math.prod(shape) * np.dtype(dtype).itemsize
    return st.builds(
        lambda d, s, data: pb.Array(dtype=d, shape=s, data=data),
        st.sampled_from([dtype, dtype, "<f8", "|b1", "<i8", "", "x"]),
        st.one_of(st.just(list(shape)), st.lists(st.integers(-1, 4), max_size=3)),
        st.one_of(st.binary(min_size=size, max_size=size), st.binary(max_size=2 * size)),
    )


@st.composite
def steps_of_any_kind(draw) -> pb.Step:
    step = pb.Step()
    for name in ("obs", "reward", "done", "truncated"):
        if draw(st.booleans()) or name == "obs":
            getattr(step, name).CopyFrom(draw(arrays(name)))
    for name, _, _ in ACTED:
        if draw(st.integers(0, 9)):  # now and then a field is missing
            step.acted[name].CopyFrom(draw(arrays(name)))
    return step


@settings(max_examples=300)
@given(steps_of_any_kind())
def test_any_step_message_decodes_exactly_as_assigned_or_is_refused_with_a_reason(step):
    try:
        fields, acted = StepDecoder(ASSIGNMENT)(step)
    except ValueError as e:
        assert str(e)
        return
    named = dict(zip(("obs", "reward", "done", "truncated"), fields, strict=True)) | acted
    assert set(named) == set(WANTED)
    for name, array in named.items():
        assert (array.dtype.str, array.shape) == WANTED[name]
        if array.dtype == np.bool_:
            assert set(array.view(np.uint8).tolist()) <= {0, 1}


_SPEC = EnvSpec("test", (3,), "float32", 2)
_SERVERS: list = []


def _server():
    """One server for every example: state carried over between them is part of the test."""
    if not _SERVERS:
        config = resolve([{"lstm": True, "lstm_size": 4, "hidden_sizes": "4"}])
        agent = make_agent("vtrace", _SPEC, config.agent, "cpu")
        transport = InProcessServer(num_actors=1, envs_per_actor=E)
        queue = UnrollQueue(1000)
        server = InferenceServer(agent, transport, queue, E, (2, 1), E, 0.0, "cpu", num_actions=2)
        transport.connect(0)
        _SERVERS.append((server, transport, queue, acted_fields(agent, _SPEC)))
    return _SERVERS[0]


def floats(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=st.floats(width=32))  # NaN and inf included


@st.composite
def well_formed_steps(draw) -> tuple[Request, np.ndarray]:
    """A local actor's step of the right shapes and dtypes, any values; and, per env, whether
    a plain loop over its values says it must be refused."""
    server, transport, _, fields = _server()
    acted = {}
    for name, shape, dtype in fields:
        if np.dtype(dtype).kind == "f":
            acted[name] = draw(floats((E, *shape)))
        else:
            acted[name] = draw(hnp.arrays(np.int64, (E, *shape), elements=st.integers(-3, 4)))
    request = Request(
        env_ids=np.arange(E),
        obs=draw(floats((E, 3))),
        reward=draw(floats((E,))),
        done=draw(hnp.arrays(np.bool_, (E,))),
        truncated=np.zeros(E, bool),
        run_id=np.ones(E, np.int64),
        route=[(0, transport._generation[0])],
        acted=acted,
    )
    wrong = np.zeros(E, bool)
    for i in range(E):
        values = [*request.obs[i].tolist(), request.reward[i]]
        values += [v for a in acted.values() if a.dtype.kind == "f" for v in a[i].ravel()]
        wrong[i] = not all(math.isfinite(v) for v in values)
        wrong[i] |= abs(float(request.reward[i])) > MAX_ABS_REWARD
        wrong[i] |= not 0 <= int(acted["action"][i]) < 2
    return request, wrong


@settings(max_examples=150, deadline=None)
@given(well_formed_steps())
def test_any_well_formed_step_is_recorded_finite_or_refused(case):
    request, wrong = case
    server, _, queue, _ = _server()
    before = server.refused_steps.copy()
    server.step(request)
    assert (server.refused_steps - before).tolist() == wrong.astype(int).tolist()
    while len(queue):
        unrolls = queue.get(1, timeout=0)
        for name, value in unrolls.steps.items():
            assert not value.is_floating_point() or torch.isfinite(value).all(), name
        assert ((unrolls.steps["action"] >= 0) & (unrolls.steps["action"] < 2)).all()
        assert all(torch.isfinite(s).all() for s in unrolls.initial_state)
    stats = server.take_stats()
    assert all(abs(r) <= MAX_ABS_REWARD for r in stats.episode_returns)


REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,  # what does not parse or is not a step as assigned
    grpc.StatusCode.FAILED_PRECONDITION,  # another protocol's hello
}


@pytest.mark.faults
def test_arbitrary_bytes_on_a_real_stream_are_refused_and_actors_served(learner):
    lr = learner()

    @settings(max_examples=40, deadline=None)
    @given(first=st.booleans(), data=st.binary(max_size=512))
    def one_stream(first: bool, data: bytes) -> None:
        ended = _raw_stream(lr.gateway.address, *((data,) if first else (_hello(), data)))
        if ended is not None:  # None: it said hello and left (data was a hello of ours)
            code, details = ended
            assert code in REFUSALS and details, ended
        client = GrpcActorClient(lr.gateway.address, token=TOKEN)
        steps(client, 2)
        client.close()

    one_stream()


@pytest.mark.faults
def test_arbitrary_first_messages_at_a_front_door_are_refused_before_any_redirect(learner):
    front, other = learner(), learner()
    # The front door has no slot of its own here: every hello it accepts is redirected.
    placement = Placement([front.gateway.address, other.gateway.address], [0, 2])
    front.gateway.serve_as_front_door(placement)

    @settings(max_examples=40, deadline=None)
    @given(data=st.binary(max_size=512))
    def one_stream(data: bytes) -> None:
        before = placement.redirects
        ended = _raw_stream(front.gateway.address, data)
        message = parse(data, limit=1 << 20)
        hello = (
            not isinstance(message, Malformed)
            and message.WhichOneof("kind") == "hello"
            and message.hello.protocol == PROTOCOL
        )
        assert placement.redirects == before + hello  # only a hello of ours is placed
        if not hello:
            code, details = ended
            assert code in REFUSALS and details, ended
        client = GrpcActorClient(front.gateway.address, token=TOKEN)
        assert client.address == other.gateway.address
        steps(client, 2)
        client.close()

    one_stream()


@given(
    sent=st.one_of(
        st.text(max_size=300),
        st.builds("{}:{}".format, st.sampled_from(["0.0.0.0", "[::]", "h", ""]), st.integers()),
    ),
    dialed=st.sampled_from(["127.0.0.1:7000", "[::1]:7000", "unix:/tmp/l.sock"]),
)
def test_any_redirect_address_is_followed_as_checked_or_refused_in_one_line(sent, dialed):
    try:
        target = redirect_target(dialed, sent)
    except Refused as e:
        assert "\n" not in str(e) and dialed in str(e)
        return
    check_address(target, "redirect")  # what the actor then dials is an address of its kind
    assert target.startswith("unix:") == dialed.startswith("unix:")
    assert not target.startswith(("0.0.0.0:", "[::]:"))  # a wildcard is the host dialed


class _Transport:
    """What ``FrameProtocol`` asks of asyncio's transport: reading paused or not."""

    paused = False

    def get_extra_info(self, name: str) -> None:
        return None

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(1, 200), min_size=1, max_size=40),
)
def test_the_socket_wire_reads_frames_whole_and_in_order_however_bytes_arrive(frames, cuts):
    """Any frames, in any chunks the socket delivers them: the same frames come out, and
    reading stops while unread frames wait and resumes once they are read."""
    stream = b"".join(framed(f) for f in frames)
    protocol = FrameProtocol(lambda p: None, lambda p: None)
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.set_limit(300)
    got: list[bytes] = []

    async def drain() -> None:
        while protocol._frames:
            got.append(await protocol.read())

    offset, i = 0, 0
    while offset < len(stream):
        if transport.paused:
            asyncio.run(drain())
            assert not transport.paused
            continue
        buffer = protocol.get_buffer(-1)
        n = min(cuts[i % len(cuts)], len(buffer), len(stream) - offset)
        buffer[:n] = stream[offset : offset + n]
        protocol.buffer_updated(n)
        offset, i = offset + n, i + 1
    asyncio.run(drain())
    assert got == frames


@given(st.integers(301, 2**32 - 1))
def test_the_socket_wire_refuses_a_frame_over_the_limit_before_reading_it(size):
    protocol = FrameProtocol(lambda p: None, lambda p: None)
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.set_limit(300)
    buffer = protocol.get_buffer(-1)
    buffer[: HEADER.size] = HEADER.pack(size)
    protocol.buffer_updated(HEADER.size)
    assert transport.paused  # nothing more is read

    async def read() -> bytes:
        return await protocol.read()

    with pytest.raises(TooLarge, match=f"message of {size} bytes"):
        asyncio.run(read())
