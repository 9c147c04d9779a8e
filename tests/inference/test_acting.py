"""The acting table: per-slot state and previous actions, reset, carried, and kept apart."""

from __future__ import annotations

import torch

from seedbed.agents import make_agent
from seedbed.inference.acting import ActingTable
from seedbed.resolve import resolve
from seedbed.types import EnvSpec

SPEC = EnvSpec("test", (3,), "float32", 2)


def lstm_agent():
    config = resolve([{"lstm": True, "lstm_size": 8, "hidden_sizes": "8"}])
    return make_agent("vtrace", SPEC, config.agent, "cpu")


def fake_state(batch: int):
    return (torch.full((batch, 2), 0.5), torch.zeros(batch, 3))  # a non-zero initial row


def step_of(slots, t: float, done: bool = False):
    n = len(slots)
    obs = torch.full((n, 3), t) + torch.as_tensor(slots, dtype=torch.float32)[:, None]
    return obs, torch.full((n,), t), torch.full((n,), done)


def test_a_new_table_holds_the_initial_state_and_no_action():
    table = ActingTable(fake_state, 4, (2,), "float32")
    assert [tuple(s.shape) for s in table.state] == [(4, 2), (4, 3)]
    assert (table.state[0] == 0.5).all() and (table.state[1] == 0).all()
    assert table.prev_action.shape == (4, 2) and table.prev_action.dtype == torch.float32
    assert not table.prev_action.any()
    assert ActingTable(fake_state, 4).prev_action.dtype == torch.int64  # discrete by default


def test_slots_are_independent_and_reset_only_their_rows():
    table = ActingTable(fake_state, 4)
    slots = torch.tensor([3, 1])
    table.record(slots, torch.tensor([7, 5]), (torch.ones(2, 2), torch.ones(2, 3) * 2))
    assert table.prev_action.tolist() == [0, 5, 0, 7]
    assert table.state[0][:, 0].tolist() == [0.5, 1.0, 0.5, 1.0]
    assert table.state[1][:, 0].tolist() == [0.0, 2.0, 0.0, 2.0]
    table.reset(torch.tensor([3]))
    assert table.prev_action.tolist() == [0, 5, 0, 0]
    assert table.state[0][:, 0].tolist() == [0.5, 1.0, 0.5, 0.5]
    assert table.state[1][:, 0].tolist() == [0.0, 2.0, 0.0, 0.0]
    table.reset()  # every slot
    assert not table.prev_action.any() and (table.state[0] == 0.5).all()


def test_inputs_gather_the_slots_rows_as_copies():
    table = ActingTable(fake_state, 4)
    table.record(torch.arange(4), torch.tensor([10, 11, 12, 13]), fake_state(4))
    slots = torch.tensor([2, 0])
    obs, reward, done = step_of([2, 0], 1.0)
    step, state = table.inputs(slots, obs, reward, done)
    assert step.prev_action.tolist() == [12, 10]
    assert step.env_ids.tolist() == [2, 0]  # the slots, unless the agent knows them otherwise
    assert step.obs is obs and step.reward is reward and step.done is done  # CPU: not copied
    table.record(slots, torch.tensor([0, 0]), (torch.zeros(2, 2), torch.ones(2, 3)))
    assert step.prev_action.tolist() == [12, 10]  # what they acted from stays as it was
    assert (state[0] == 0.5).all() and (state[1] == 0).all()
    other = table.inputs(slots, obs, reward, done, env_ids=torch.tensor([40, 42]))[0]
    assert other.env_ids.tolist() == [40, 42]


def test_every_slot_at_once_takes_the_agents_tensors_and_leaves_what_acted():
    table = ActingTable(fake_state, 2)
    step, state = table.inputs(None, *step_of([0, 1], 0.0, done=True))
    assert step.env_ids.tolist() == [0, 1] and step.prev_action.tolist() == [0, 0]
    action, following = torch.tensor([1, 0]), (torch.ones(2, 2), torch.ones(2, 3))
    table.record(None, action, following)
    assert table.prev_action is action and table.state[0] is following[0]  # no copy
    assert (state[0] == 0.5).all() and (state[1] == 0).all()  # the state acted from
    assert step.prev_action.tolist() == [0, 0]


def test_recurrent_state_is_carried_across_steps_as_by_hand():
    torch.manual_seed(0)
    agent = lstm_agent()
    net = agent.acting_network()
    table = ActingTable(agent.initial_state, 3)
    slots = torch.arange(3)
    state = agent.initial_state(3)
    prev = torch.zeros(3, dtype=torch.int64)
    for t in range(4):
        obs, reward, done = step_of([0, 1, 2], float(t), done=t == 0)
        step, acted_from = table.inputs(slots, obs, reward, done)
        assert torch.equal(step.prev_action, prev)
        assert all(torch.equal(a, b) for a, b in zip(acted_from, state, strict=True))
        out = agent.act(net, step, acted_from)
        action = torch.tensor([t % 2, 1, 0])
        table.record(slots, action, out.state)
        state, prev = out.state, action
    assert table.state[0].abs().sum() > 0  # the LSTM moved on


def test_a_slot_acts_the_same_whichever_slots_share_its_batch():
    torch.manual_seed(0)
    agent = lstm_agent()
    net = agent.acting_network()
    together, alone = ActingTable(agent.initial_state, 3), ActingTable(agent.initial_state, 3)
    for t in range(4):
        obs, reward, done = step_of([0, 1, 2], float(t), done=t == 0)
        action = torch.tensor([1, t % 2, 0])
        every = torch.arange(3)
        step, state = together.inputs(every, obs, reward, done)
        together.record(every, action, agent.act(net, step, state).state)
        for i in (2, 0, 1):  # one slot per call, out of order
            slot = torch.tensor([i])
            step, state = alone.inputs(slot, obs[i : i + 1], reward[i : i + 1], done[i : i + 1])
            alone.record(slot, action[i : i + 1], agent.act(net, step, state).state)
    for a, b in zip(together.state, alone.state, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.equal(together.prev_action, alone.prev_action)


def test_an_episode_start_acts_as_from_a_fresh_table():
    torch.manual_seed(0)
    agent = lstm_agent()
    net = agent.acting_network()
    table, fresh = ActingTable(agent.initial_state, 2), ActingTable(agent.initial_state, 2)
    slots = torch.arange(2)
    for t in range(3):  # some history: state and previous actions away from their start
        step, state = table.inputs(slots, *step_of([0, 1], float(t), done=t == 0))
        table.record(slots, torch.tensor([1, 1]), agent.act(net, step, state).state)
    assert table.prev_action.any() and table.state[0].abs().sum() > 0
    obs, reward, done = step_of([0, 1], 5.0, done=True)  # both envs begin a new episode
    outputs = []
    for t in (table, fresh):
        step, state = t.inputs(slots, obs, reward, done)
        outputs.append(agent.acting_outputs(net, step, state))
    (logits, after), (fresh_logits, fresh_after) = outputs
    torch.testing.assert_close(logits, fresh_logits)
    for a, b in zip(after, fresh_after, strict=True):
        torch.testing.assert_close(a, b)
    # An actor's restart resets explicitly: the table itself then equals a fresh one.
    table.reset(slots)
    assert not table.prev_action.any()
    assert all(torch.equal(a, b) for a, b in zip(table.state, fresh.state, strict=True))


def test_a_feed_forward_agent_has_no_state_to_keep():
    table = ActingTable(lambda n: (), 2, (2,), "float32")
    step, state = table.inputs(torch.tensor([1]), *step_of([1], 0.0))
    assert state == () and step.prev_action.shape == (1, 2)
    table.record(torch.tensor([1]), torch.tensor([[0.5, -0.5]]), ())
    table.reset(torch.tensor([0]))
    assert table.prev_action.tolist() == [[0.0, 0.0], [0.5, -0.5]]
