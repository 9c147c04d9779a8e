"""Torch modules the agents are built from: torsos, an LSTM core, policy and value heads.

Networks take time-major inputs ``[T, B, ...]`` so that the same module serves central inference
(T = 1) and learning on unrolls (T + 1 steps), and the recurrent state is carried batch-first,
one row per environment, so inference can index it by environment id.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from seedbed.errors import ConfigError
from seedbed.normalize import ObsNormalizer, PopArtValue
from seedbed.types import EnvSpec, State


class MLPTorso(nn.Module):
    """Flattened observation -> ReLU layers."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = math.prod(obs_shape)
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.layers = nn.Sequential(*layers)
        self.out_size = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, *obs_shape] in any dtype (uint8 frames are scaled to [0, 1]) -> [N, out_size]."""
        return self.layers(_scaled(obs.flatten(1)))


def _scaled(obs: torch.Tensor) -> torch.Tensor:
    """Observations as float; uint8 frames become [0, 1] here, once, on the network's device.

    Under autocast (bfloat16 torsos) frames go straight to its dtype, which holds 0-255
    exactly: the same values the first layer would get by casting float32 frames down, without
    the float32 copy: each pass over a learner batch of frames costs as much as a small layer.
    """
    device = obs.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    if obs.dtype != torch.uint8:  # in autocast's dtype already when ActorCriticNet.prepare made it
        return obs if obs.dtype == dtype else obs.float()
    return obs.to(dtype).div_(255.0)


def _orthogonal(module: nn.Module) -> nn.Module:
    """Orthogonal weights (gain sqrt 2, for ReLU) and zero biases on every conv and linear
    layer: the image torsos' activations then keep their scale through the layers, and a
    near-constant input such as a game's background does not leave most units dead."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            nn.init.zeros_(m.bias)
    return module


def _images(obs: torch.Tensor) -> torch.Tensor:
    """Frames [N, C, H, W] scaled and channels-last, the layout oneDNN and cuDNN convolve
    fastest (the uint8 frames are reordered, a quarter of the bytes of floats)."""
    return _scaled(obs.contiguous(memory_format=torch.channels_last))


def _flat_relu() -> tuple[nn.Module, nn.Module]:
    """The ReLU after an image torso's last convolution, with the flatten before it: the same
    values, but its backward then meets the gradient in the layout its output has. After the
    channels-last convolution that output was channels-last and the gradient, coming back
    through the flatten, plain contiguous, and a backward across mismatched layouts is many
    times slower."""
    return nn.Flatten(), nn.ReLU()


class NatureCNN(nn.Module):
    """The DQN torso of Mnih et al. (2015): three convolutions and a 512-unit layer."""

    channels_last = True  # it reads frames channels-last (``_images``)

    # (channels, kernel, stride) of each convolution, and the width of the layer after them.
    CONVS: tuple[tuple[int, int, int], ...] = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    OUT_SIZE = 512

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        depth = obs_shape[0]
        for channels, kernel, stride in self.CONVS:
            layers += [nn.Conv2d(depth, channels, kernel, stride=stride), nn.ReLU()]
            depth = channels
        self.convs = nn.Sequential(*layers[:-1], *_flat_relu())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, self.OUT_SIZE), nn.ReLU())
        self.out_size = self.OUT_SIZE
        _orthogonal(self).to(memory_format=torch.channels_last)  # as _images makes inputs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] frames -> [N, out_size]."""
        return self.fc(self.convs(_images(obs)))


class A3CCNN(NatureCNN):
    """The smaller torso of DQN's first paper and A3C (Mnih et al. 2013, 2016): two
    convolutions, 16 and 32 channels, and a 256-unit layer: on 84x84x4 frames about a third of
    the Nature CNN's arithmetic per forward pass, for learners that the torso bounds."""

    CONVS = ((16, 8, 4), (32, 4, 2))
    OUT_SIZE = 256


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResNet(nn.Module):
    """IMPALA's deep torso (Espeholt et al. 2018): three stacks of conv, max-pool and two
    residual blocks, with 16, 32 and 32 channels, then a 256-unit layer."""

    channels_last = True  # it reads frames channels-last (``_images``)

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        channels: tuple[int, ...] = (16, 32, 32),
        out_size: int = 256,
    ) -> None:
        super().__init__()
        stacks: list[nn.Module] = []
        depth = obs_shape[0]
        for width in channels:
            stacks += [
                nn.Conv2d(depth, width, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(width),
                _ResidualBlock(width),
            ]
            depth = width
        self.stacks = nn.Sequential(*stacks, *_flat_relu())
        with torch.no_grad():
            flat = self.stacks(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, out_size), nn.ReLU())
        self.out_size = out_size
        _orthogonal(self).to(memory_format=torch.channels_last)  # as _images makes inputs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] frames -> [N, out_size]."""
        return self.fc(self.stacks(_images(obs)))


class FootballResNet(ImpalaResNet):
    """SEED RL's Google Research Football torso (its ``GFootball`` network): IMPALA's ResNet
    with a fourth stack, 16, 32, 32 and 32 channels, then a 256-unit layer. Four stride-2
    pools take the 72x96 Super Mini Map down to 5x6 before the linear layer."""

    # The sparse 0/255 planes give large, mostly positive features at init: a unit-scale value
    # head then starts far from returns within [-1, 1], and the value loss shrinks the shared
    # features until the policy barely moves. A value head starting near 0 keeps them.
    value_gain = 0.01

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__(obs_shape, channels=(16, 32, 32, 32), out_size=256)


TORSOS = {
    "mlp": MLPTorso,
    "nature": NatureCNN,
    "a3c": A3CCNN,
    "impala": ImpalaResNet,
    "football": FootballResNet,
}


class LSTMCore(nn.Module):
    """An LSTM over time that resets each environment's state where its episode starts."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def initial_state(self, batch_size: int, device: torch.device | None = None) -> State:
        zeros = torch.zeros(batch_size, self.hidden_size, device=device)
        return (zeros, zeros.clone())

    def forward(
        self, x: torch.Tensor, done: torch.Tensor, state: State
    ) -> tuple[torch.Tensor, State]:
        """x [T, B, D], done [T, B] -> outputs [T, B, H] and the state after the last step."""
        h, c = state
        outputs = []
        for t in range(x.shape[0]):
            keep = (~done[t]).unsqueeze(-1).to(h.dtype)
            h, c = self.cell(x[t], (h * keep, c * keep))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


class GaussianHead(nn.Module):
    """A Gaussian policy's parameters ``[..., 2A]``: a linear mean of the features, and a
    log standard deviation that is one learned vector (state-independent, as PPO's MuJoCo agents
    have it) or, with ``std_head``, a second linear head of the features."""

    LOG_STD_RANGE = (-5.0, 2.0)  # std 0.007 to 7.4: no collapse to a point, no wild exploration

    def __init__(
        self, in_size: int, action_size: int, std_head: bool = False, init_log_std: float = 0.0
    ) -> None:
        super().__init__()
        self.mean = nn.Linear(in_size, action_size)
        # Small weights: every state starts near the same action, as with a uniform softmax.
        nn.init.orthogonal_(self.mean.weight, gain=0.01)
        nn.init.zeros_(self.mean.bias)
        self.log_std: nn.Module | nn.Parameter
        if std_head:
            self.log_std = nn.Linear(in_size, action_size)
            nn.init.zeros_(self.log_std.weight)
            nn.init.constant_(self.log_std.bias, init_log_std)
        else:
            self.log_std = nn.Parameter(torch.full((action_size,), float(init_log_std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean(x)
        if isinstance(self.log_std, nn.Parameter):
            log_std = self.log_std.expand_as(mean)
        else:
            log_std = self.log_std(x)
        return torch.cat([mean, log_std.clamp(*self.LOG_STD_RANGE)], dim=-1)


class ActorCriticNet(nn.Module):
    """Optional observation normalizer, torso, optional LSTM core (fed the previous action and
    reward), policy head (logits, or a Gaussian's parameters) and value head (PopArt's, or
    plain)."""

    def __init__(
        self,
        torso: nn.Module,
        num_actions: int,
        lstm_size: int | None,
        value_torso: nn.Module | None = None,
        torso_dtype: torch.dtype = torch.float32,
        policy: nn.Module | None = None,
        action_size: int | None = None,
        obs_normalizer: ObsNormalizer | None = None,
        popart_beta: float | None = None,
    ) -> None:
        """``policy`` replaces the linear logits head (a ``GaussianHead`` for continuous
        actions, which then have ``action_size`` dimensions); ``popart_beta`` makes the value
        head PopArt's, its statistics moving at that rate."""
        super().__init__()
        self.obs_norm = obs_normalizer
        self.torso = torso
        # bfloat16 torsos run under autocast (mixed precision): the parameters, the core, the
        # heads and every loss stay float32; only the torso's convolutions and matmuls drop.
        self.torso_dtype = torso_dtype
        # A separate value torso keeps large value-regression gradients out of the policy's
        # features; only feed-forward networks use one (a recurrent core is shared).
        self.value_torso = value_torso if lstm_size is None else None
        self.num_actions = num_actions
        self.continuous = policy is not None
        core_in = torso.out_size
        self.core = None
        if lstm_size:
            # The previous action goes in one-hot, or as it is when continuous.
            action_in = action_size if self.continuous else num_actions
            self.core = LSTMCore(core_in + action_in + 1, lstm_size)
            core_in = lstm_size
        self.policy = nn.Linear(core_in, num_actions) if policy is None else policy
        if popart_beta is None:
            self.value = nn.Linear(core_in, 1)
        else:
            self.value = PopArtValue(core_in, popart_beta)

    def initial_state(self, batch_size: int, device: torch.device | None = None) -> State:
        return () if self.core is None else self.core.initial_state(batch_size, device)

    def forward(
        self,
        obs: torch.Tensor,
        prev_action: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
        state: State,
        values: bool = True,
        prepared: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, State]:
        """Inputs [T, B, ...] -> policy parameters [T, B, P] (logits, or a Gaussian's mean and
        log-std), values [T, B], next state.

        ``values=False`` skips the value head (and a separate value torso): acting with a
        policy gradient agent needs only the policy, and the value torso costs as much as the
        policy's. ``prepared`` says ``obs`` went through ``prepare`` already.
        """
        steps, batch = obs.shape[:2]
        flat = obs.reshape(steps * batch, *obs.shape[2:])
        if not prepared:
            flat = self.prepare(flat)
        x = self._features(self.torso, flat).view(steps, batch, -1)
        if self.core is not None:
            # The previous action and reward belong to the last episode where a new one starts.
            keep = (~done).unsqueeze(-1).to(x.dtype)
            if self.continuous:
                acted = prev_action.reshape(steps, batch, -1).to(x.dtype) * keep
            else:
                acted = F.one_hot(prev_action, self.num_actions).to(x.dtype) * keep
            clipped = reward.clamp(-1.0, 1.0).unsqueeze(-1).to(x.dtype) * keep
            x, state = self.core(torch.cat([x, acted, clipped], dim=-1), done, state)
        if not values:
            return self.policy(x), None, state
        v = x if self.value_torso is None else self._features(self.value_torso, flat)
        return self.policy(x), self.value(v.view(steps, batch, -1)).squeeze(-1), state

    def prepare(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations ``[..., *obs_shape]`` as the torso reads them: normalized by the running
        statistics, in the torso's dtype (what autocast would cast them to), if this net
        normalizes; else as they are. A learner that passes over a batch several times prepares
        it once: per-pixel normalization of Atari frames costs a fifth of a bfloat16 pass."""
        if self.obs_norm is None:
            return obs
        out = None
        if getattr(self.torso, "channels_last", False):
            # In the layout the torso convolves (``_images``), so that neither the minibatches
            # taken from a prepared batch nor each pass over them copy it again.
            *lead, channels, height, width = obs.shape
            shape = (*lead, height, width, channels)
            out = torch.empty(shape, dtype=self.torso_dtype, device=obs.device).movedim(-1, -3)
        return self.obs_norm(obs, self.torso_dtype, out)

    def _features(self, torso: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        if self.torso_dtype == torch.float32:
            return torso(obs)  # no autocast context: entering one costs as much as a small layer
        with torch.autocast(obs.device.type, dtype=self.torso_dtype):
            return torso(obs).float()


def torso_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torso's compute dtype: 'auto' is bfloat16 where ``device`` runs it fast (GPUs with
    bfloat16; CPUs with native bfloat16 instructions, AVX512-BF16 or AMX, through oneDNN), else
    float32. oneDNN also runs bfloat16 on plain AVX-512 by converting, which is no faster."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
    else:
        native = (torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_amx_tile_supported())
        fast = torch.backends.mkldnn.is_available() and any(native)
    return torch.bfloat16 if fast else torch.float32


def make_torso(name: str, obs_shape: tuple[int, ...], hidden_sizes: tuple[int, ...]) -> nn.Module:
    """Torso ``name`` ('mlp', 'nature', 'a3c', 'impala' or 'football') for observations of
    ``obs_shape``."""
    if name == "mlp":
        return MLPTorso(obs_shape, hidden_sizes)
    if len(obs_shape) != 3:
        raise ConfigError(
            f"--torso {name} needs image observations [channels, height, width], got shape "
            f"{obs_shape}; use --torso mlp"
        )
    return TORSOS[name](obs_shape)


def make_actor_critic(
    env_spec: EnvSpec,
    hidden_sizes: tuple[int, ...],
    lstm_size: int | None,
    shared_torso: bool = True,
    torso: str = "mlp",
    torso_dtype: torch.dtype = torch.float32,
    normalize_obs: bool = False,
    popart_beta: float | None = None,
    std_head: bool = False,
    init_log_std: float = 0.0,
) -> ActorCriticNet:
    """The actor-critic network for ``env_spec`` with torso ``torso``: logits for discrete
    actions, a Gaussian (``std_head``, ``init_log_std``: see ``GaussianHead``) for continuous
    ones; observations normalized by their running statistics if ``normalize_obs``; a PopArt
    value head if ``popart_beta`` is set."""
    body = make_torso(torso, env_spec.obs_shape, hidden_sizes)
    value_torso = None if shared_torso else make_torso(torso, env_spec.obs_shape, hidden_sizes)
    policy = action_size = None
    if env_spec.continuous:
        action_size = math.prod(env_spec.action_shape)
        core_out = lstm_size or body.out_size
        policy = GaussianHead(core_out, action_size, std_head, init_log_std)
    net = ActorCriticNet(
        body,
        env_spec.num_actions,
        lstm_size,
        value_torso,
        torso_dtype,
        policy,
        action_size,
        ObsNormalizer(env_spec.obs_shape) if normalize_obs else None,
        popart_beta,
    )
    if torso != "mlp":
        # With the image torsos' orthogonal init, default heads start from a far-from-uniform
        # policy whose entropy bonus then drives features dead; start uniform instead, with
        # a unit-scale value head (as PPO implementations do). MLP defaults were tuned as is.
        if policy is None:
            nn.init.orthogonal_(net.policy.weight, gain=0.01)
            nn.init.zeros_(net.policy.bias)
        nn.init.orthogonal_(net.value.weight, gain=getattr(body, "value_gain", 1.0))
        nn.init.zeros_(net.value.bias)
    return net
