"""Actors: step E environments together and ask the learner for their actions.

In central mode an actor holds no model and knows nothing of the agent: it only turns actions
into observations. It imports neither torch nor the learner, so it starts in a fraction of a second.
With local inference (``--inference local``) it acts itself with a ``LocalPolicy`` (``local``,
which imports torch: only such actors load it) and sends what it acted with each step.
Local actors are processes the learner spawns (``run_actor``); remote ones are started by hand or
by a cluster launcher and connect over gRPC (``run_remote_actor``), learning what to run from the
learner.

An env that gives NaN, inf or absurd observations or rewards now and then is the learner's to
handle (it refuses those steps); one that gives them ``REFUSED_IN_A_ROW`` steps in a row is
broken, and its actor stops with one line that names it.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from typing import Any

import numpy as np

from seedbed.envs import make_settings, make_vector_env
from seedbed.errors import SeedbedError
from seedbed.plugins import import_plugins
from seedbed.transport.base import ActorTransport, Endpoint
from seedbed.transport.checks import REFUSED_IN_A_ROW, check_step

log = logging.getLogger(__name__)


def act(
    client: ActorTransport, envs: Any, seed: int, policy: Any = None, env_id: str = "the env"
) -> None:
    """Step ``envs`` until the client raises ConnectionError: with the actions ``client.call``
    returns, or with those ``policy`` (a ``LocalPolicy``) picks (the call loops of
    ``seedbed.transport.base``).

    Raises:
        SeedbedError: When one of the envs (``env_id``) gives refused values (see the module)
            ``REFUSED_IN_A_ROW`` steps in a row.
    """
    num_envs = envs.num_envs
    obs, _ = envs.reset(seed=seed)
    reward = np.zeros(num_envs, np.float32)
    done = np.ones(num_envs, np.bool_)  # every env starts an episode
    truncated = np.zeros(num_envs, np.bool_)
    refused_in_a_row = np.zeros(num_envs, np.int64)
    submitted = False
    while True:
        bad, why = check_step(obs, reward)
        refused_in_a_row = np.where(bad, refused_in_a_row + 1, 0)
        if why is not None and refused_in_a_row.max() >= REFUSED_IN_A_ROW:
            raise SeedbedError(
                f"env {int(refused_in_a_row.argmax())} of this actor ({env_id}) gave a {why} "
                f"in {REFUSED_IN_A_ROW} steps in a row: fix the environment"
            )
        if policy is None:
            action = client.call(obs, reward, done, truncated)
        else:
            # The learner's answer only says it has recorded the last step (so its rows may be
            # written again): the actor acts and steps its envs meanwhile.
            acted = policy.act(obs, reward, done)
            if submitted:
                client.collect()
            client.submit(obs, reward, done, truncated, acted)
            submitted, action = True, acted["action"]
        obs, reward, terminated, truncated, _ = envs.step(action)
        done = terminated | truncated
        # Gymnasium's TimeLimit says truncated at the limit even where the task ended there:
        # that end is the task's, not a cut a learner may bootstrap across.
        truncated = truncated & ~terminated


def run_actor(
    endpoint: Endpoint,
    env_id: str,
    num_envs: int,
    settings: Any,
    local: Any,
    plugins: tuple[str, ...],
    seed: int,
) -> None:
    """Act until the learner goes away. ``endpoint.open()`` gives the transport client;
    ``settings`` are the env family's (None: its defaults); ``local`` (a ``LocalActing``) makes
    the actor pick its own actions, None leaves it central; ``plugins`` are imported first (they
    register the env family or agent a spawned process would not know otherwise)."""
    # The learner decides when actors stop: a Ctrl-C, or a SIGTERM sent to the whole group,
    # reaches it too, and it stops them once its final checkpoint and summary are written.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    import_plugins(plugins)
    client = endpoint.open()
    envs = make_vector_env(env_id, num_envs, seed, settings)
    policy = None
    try:
        if local is not None:
            from seedbed.actor.local import LocalPolicy  # torch: only actors that act

            policy = LocalPolicy(local, endpoint.actor * num_envs, num_envs, seed)
        act(client, envs, seed, policy, env_id)
    except ConnectionError:
        log.debug("actor %s: learner gone, stopping", getattr(endpoint, "actor", "?"))
    except SeedbedError as e:
        log.error("actor %s: %s", getattr(endpoint, "actor", "?"), e)  # one line, no traceback
        raise SystemExit(1) from None
    finally:
        client.close()
        envs.close()
        if policy is not None:
            policy.close()


def _remote_policy(client: Any, settings: Any) -> Any:
    """The ``LocalPolicy`` a remote actor acts with, as its assignment describes it; the
    stream itself brings the policies."""
    from seedbed.actor.local import LocalActing, LocalPolicy
    from seedbed.agents import config_class
    from seedbed.config import build
    from seedbed.envs import make_spec

    job = client.assignment
    local = job.local
    agent_config = build(config_class(local["agent"]), local["agent_config"])
    spec = make_spec(job.env_id, settings)
    acting = LocalActing(local["agent"], agent_config, spec, local["num_envs"], client.board)
    return LocalPolicy(acting, local["first_env"], job.num_envs, job.seed)


def run_remote_actor(
    address: str,
    token: bytes | None = None,
    tls_ca: bytes | None = None,
    reconnect_for_s: float = 60.0,
    wire: str = "grpc",
) -> str:
    """Act for the learner at ``address`` until it says training is over; return its reason.
    ``wire``: the learner's ``--wire``.

    A lost connection is retried with exponential backoff (0.5 s doubling to 10 s, jittered).
    Each new stream is a new run id: the learner resets the actor's environments, and the actor
    starts fresh episodes. A replicated learner's front door (``address``) may send the actor to
    another replica; a reconnect always starts at ``address``, to be placed again. Raises
    SeedbedError when the learner refuses the actor (token, version, a bad redirect) or stays
    unreachable for ``reconnect_for_s`` seconds.
    """
    from seedbed.transport.remote import LearnerStopped, open_client

    delay, failing_since = 0.5, None
    while True:
        try:
            client = open_client(address, wire, token=token, tls_ca=tls_ca)
        except ConnectionError as e:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > reconnect_for_s:
                raise SeedbedError(
                    f"no learner at {address} for {reconnect_for_s:.0f} s ({e}); giving up"
                ) from None
            log.warning("%s; retrying in %.1f s", e, delay)
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, 10.0)
            continue
        failing_since, delay = None, 0.5
        job = client.assignment
        log.info(
            "acting in slot %d of %s: %d x %s", job.slot, client.address, job.num_envs, job.env_id
        )
        envs = policy = None
        try:
            import_plugins(job.plugins)  # what the learner's run registered, before its settings
            settings = make_settings(job.env_id, job.settings)  # the learner's env settings
            envs = make_vector_env(job.env_id, job.num_envs, job.seed, settings)
            if job.local is not None:
                policy = _remote_policy(client, settings)
            act(client, envs, job.seed, policy, job.env_id)
        except LearnerStopped as e:
            return str(e)
        except ConnectionError as e:
            log.warning("%s; reconnecting", e)
        finally:
            client.close()
            if envs is not None:
                envs.close()
            if policy is not None:
                policy.close()
