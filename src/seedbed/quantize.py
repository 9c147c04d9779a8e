"""Policy broadcasts at a precision: a network to pickle-free bytes and back, and their error.

In local-inference mode (ActorQ, Krishnan et al. 2022) the learner encodes its policy once per
broadcast and actors decode the bytes into the module they act with; a CPU learner acting
centrally in int8 builds the same module without the bytes (``quantize_for_inference``).

What each tensor becomes, by precision:

====================================  =======  =========================  ==========================
tensor                                fp32     fp16                       int8
====================================  =======  =========================  ==========================
``nn.Linear`` weight                  float32  float16, upcast on decode  int8 per output channel
``nn.LSTMCell`` weight_ih, weight_hh  float32  float16, upcast on decode  int8 per gate row
either, under 128 x 128 weights       float32  float16, upcast on decode  float32 (faster)
an MLP torso's first layer            float32  float16, upcast on decode  float32 (reads raw obs)
biases, convolutions, anything else   float32  float16, upcast on decode  float32
====================================  =======  =========================  ==========================

int8 is PyTorch's dynamic quantization with ``per_channel_dynamic_qconfig``: symmetric int8
weights with a float32 scale and an int8 zero point (always 0) per output row, activations
quantized per batch inside the kernels (x86/fbgemm), so actors run int8 GEMMs; an int8 Linear
that a ReLU follows in a Sequential (an MLP's hidden layers) becomes torch's fused
``LinearReLU``, and that ReLU an ``Identity``. Dynamic
quantization has no convolutions (those would need static calibration), so conv torsos stay
float32 and only their fully connected layer drops; the LSTM core is quantized too, as
``quantize_dynamic`` does by default (its error stays bounded over an unroll: the tests check
it). An int8 network computes its float layers in float32 even where the template's torso runs
under bfloat16 autocast, since the int8 kernels take float32 inputs. fp16 only halves the
bytes: decode upcasts to float32, because CPUs without native fp16 arithmetic run a forward
slower under float16 autocast and no faster with fbgemm's fp16-weight kernel
(``bench/actorq.py speed --kernels`` measures the three; docs/benchmarks.md, quantized actors).

A payload holds the parts of the network that acting reads: ``skip`` names submodules left out
(an agent's ``acting_skips``, e.g. V-trace's value torso), which keep the template's values on
decode. Both ends must name the same ones; the header's array list tells them apart.

Payload: ``_PREFIX`` (magic, format, header length, CRC-32 of the rest), a JSON header
``{"precision", "version", "arrays": [[name, dtype, shape], ...]}`` and the arrays' raw
little-endian bytes back to back. Decoding checks everything against the template network
before it allocates; the checksum also catches a payload torn by a concurrent write.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import struct
import warnings
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from seedbed.errors import SeedbedError
from seedbed.nets import MLPTorso

# torch.ao.quantization is deprecated in favour of torchao, which is not installed here and has no
# dynamic int8 CPU kernels of its own; its warnings fire on import and on every quantized tensor
# made and tell a user nothing to act on, so exactly those two messages are silenced.
_DEPRECATIONS = (".*torch.ao.quantization is deprecated", ".*quantized tensor creation")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence those warnings. ``catch_warnings`` swaps the process-wide filters: meanwhile other
    threads see these filters too, and a filter another thread adds is dropped on exit."""
    with warnings.catch_warnings():
        for message in _DEPRECATIONS:
            warnings.filterwarnings("ignore", message)
        yield


with _quiet():
    from torch.ao.nn.intrinsic.quantized import dynamic as nniqd
    from torch.ao.nn.quantized import dynamic as nnqd

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

_MAGIC = b"SBPW"
_FORMAT = 1
_PREFIX = struct.Struct("<4sB3xII")  # magic, format, header bytes, CRC-32 of header + arrays
_MAX_HEADER = 1 << 22
_DTYPES = {
    name: (getattr(torch, name), np.dtype(name).newbyteorder("<"))
    for name in ("float32", "float16", "int8", "uint8", "int32", "int64")
}


_INT8_WEIGHTS = {nn.Linear: ("weight",), nn.LSTMCell: ("weight_ih", "weight_hh")}
# Smaller layers (policy and value heads, CartPole's first layer) stay float32: int8's fixed cost
# per call (find the input's range, quantize it, requantize) exceeds the GEMM time they save.
_MIN_INT8_WEIGHTS = 128 * 128


class PolicyPayloadError(SeedbedError):
    """A policy payload that is truncated, corrupted or made for another network."""


def encode_policy(
    net: nn.Module, precision: Precision, version: int, skip: tuple[str, ...] = ()
) -> bytes:
    """``net``'s parameters at ``precision`` as a self-describing byte payload (no pickle),
    carrying the policy ``version`` (>= 0). ``skip`` names submodules that acting never reads
    (an agent's ``acting_skips``: V-trace's value torso, D4PG's critic), left out."""
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    arrays = _arrays(net, precision, skip)
    header = {
        "precision": precision,
        "version": int(version),
        "arrays": [
            [name, str(a.dtype).removeprefix("torch."), list(a.shape)] for name, a in arrays.items()
        ],
    }
    # Tensors' bytes as they lie in memory: little-endian on every platform torch ships for.
    body = [json.dumps(header, separators=(",", ":")).encode()]
    body += [a.numpy().tobytes() for a in arrays.values()]
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return b"".join([_PREFIX.pack(_MAGIC, _FORMAT, len(body[0]), crc), *body])


def decode_policy(
    payload: bytes | memoryview,
    template: nn.Module,
    skip: tuple[str, ...] = (),
    into: nn.Module | None = None,
) -> tuple[nn.Module, int]:
    """The CPU module an actor acts with, from a payload of a network shaped like ``template``
    (encoded with the same ``skip``: those submodules keep ``template``'s values), and the policy
    version it carries. Raises PolicyPayloadError (one line) on a bad payload.

    ``into``, a module an earlier call returned for ``template``, is updated in place and
    returned when it has the payload's form (int8 or float): an actor that decodes every
    broadcast then skips copying the template and packs each int8 weight once, not three times."""
    precision, version, arrays = _unpack(memoryview(payload), template, skip)
    layers = _int8_layers(template, skip) if precision == "int8" else {}
    if into is not None and _int8_prefixes(into) == set(layers):
        # Copied tensor by tensor: quantized modules' load_state_dict wants their packed form.
        tensors = {**dict(into.named_parameters()), **dict(into.named_buffers())}
        with torch.no_grad():
            for name, value in _floats(arrays).items():
                if name in tensors:  # the others are the int8 layers' biases, packed below
                    tensors[name].copy_(value)
        for prefix, names in layers.items():
            _load_int8(into.get_submodule(prefix), prefix, names, arrays)
        return into, version
    return _build(template, precision, arrays, skip), version


def quantize_for_inference(net: nn.Module, precision: Precision) -> nn.Module:
    """The module ``decode_policy(encode_policy(net, precision, v), net)`` returns, without the
    bytes: what a CPU learner acts with centrally at ``precision``."""
    return _build(net, precision, _arrays(net, precision))


@torch.no_grad()
def policy_error(
    reference: nn.Module, quantized: nn.Module, outputs: Callable[..., Any], probe: tuple
) -> float:
    """Largest absolute change of any floating output of ``outputs(net, *probe)`` from
    ``reference`` to ``quantized``, ``probe`` moved to each network's device: ``outputs`` is
    an agent's ``acting_outputs`` and ``probe`` its step and state, or any call of a network
    and its arguments."""
    ref = _leaves(outputs(reference, *_to(probe, _device(reference))))
    new = _leaves(outputs(quantized, *_to(probe, _device(quantized))))
    diffs = [(a.cpu().float() - b.cpu().float()).abs().max() for a, b in zip(ref, new, strict=True)]
    return float(max(diffs, default=torch.tensor(0.0)))


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.startswith(f"{s}.") for s in skip)


def _int8_layers(net: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """The modules int8 quantizes, by name, with the weights each quantizes: every nn.Linear
    and nn.LSTMCell (with biases) of at least ``_MIN_INT8_WEIGHTS`` weights, but the layer that
    reads an MLP torso's raw observations.

    That layer stays float32: observation features differ in scale tenfold (CartPole's pole
    angle spans +-0.2, its velocities +-3), and one 7-bit activation scale for all of them
    blurs the small ones; keeping it cuts a CartPole MLP's int8 logit error fourfold."""
    observing = {id(m.layers[0]) for m in net.modules() if isinstance(m, MLPTorso) and m.layers}
    layers = {}
    for name, module in net.named_modules():
        if _skipped(name, skip):
            continue
        weights = _INT8_WEIGHTS.get(type(module), ())
        size = sum(getattr(module, w).numel() for w in weights)
        biased = getattr(module, "bias", None) is not False  # int8 LSTM cells need biases
        if size >= _MIN_INT8_WEIGHTS and biased and id(module) not in observing:
            layers[name] = weights
    return layers


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _forms(
    net: nn.Module, precision: str, skip: tuple[str, ...]
) -> Iterator[tuple[str, torch.Tensor, str]]:
    """Each state entry of ``net`` outside ``skip``, its tensor, and the form it travels in:
    'int8' (with scales and zero points) or a dtype name."""
    layers = _int8_layers(net, skip) if precision == "int8" else {}
    int8 = {_join(prefix, w) for prefix, weights in layers.items() for w in weights}
    for name, tensor in net.state_dict().items():
        if _skipped(name, skip):
            continue
        if name in int8:
            yield name, tensor, "int8"
        elif tensor.is_floating_point():
            yield name, tensor, "float16" if precision == "fp16" else "float32"
        else:
            yield name, tensor, str(tensor.dtype).removeprefix("torch.")


def _layout(net: nn.Module, precision: str, skip: tuple[str, ...]) -> list[list[Any]]:
    """The header's array list that a payload for ``net`` at ``precision`` must have."""
    layout = []
    for name, tensor, form in _forms(net, precision, skip):
        shape = list(tensor.shape)
        layout.append([name, form, shape])
        if form == "int8":
            layout += [
                [f"{name}#scale", "float32", shape[:1]],
                [f"{name}#zero_point", "int8", shape[:1]],
            ]
    return layout


def _arrays(net: nn.Module, precision: str, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """``net``'s state at ``precision`` as CPU tensors, in ``_layout`` order."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    arrays = {}
    with torch.no_grad():
        for name, tensor, form in _forms(net, precision, skip):
            tensor = tensor.detach().cpu()
            if form == "int8":
                arrays[name], arrays[f"{name}#scale"] = _quantize(tensor.float())
                arrays[f"{name}#zero_point"] = torch.zeros(len(tensor), dtype=torch.int8)
            else:
                arrays[name] = tensor.to(_DTYPES[form][0]).contiguous()
    return arrays


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row, and each row's float32 scale: the bytes ``quantize_dynamic``
    with ``per_channel_dynamic_qconfig`` makes (the tests compare them), without its observer
    and quantized tensor, which cost several times more, since the learner quantizes at every
    broadcast."""
    rows = weight.reshape(len(weight), -1)
    # The observer's symmetric range: the largest magnitude maps to 127.5 steps, the scale at
    # least float32's epsilon (an all-zero row), zero point 0; values round half to even.
    scale = (rows.abs().amax(1) / 127.5).clamp_min(torch.finfo(torch.float32).eps)
    q = torch.round(rows * (1.0 / scale)[:, None]).clamp_(-128, 127).to(torch.int8)
    return q.reshape(weight.shape), scale


def _build(
    template: nn.Module, precision: str, arrays: dict[str, torch.Tensor], skip: tuple[str, ...] = ()
) -> nn.Module:
    """A frozen CPU copy of ``template`` holding ``arrays`` (laid out as ``_layout`` says)."""
    net = copy.deepcopy(template).cpu()
    net.load_state_dict(_floats(arrays), strict=False)  # the rest, int8 weights, go in just below
    if precision != "int8":
        return net.eval().requires_grad_(False)
    for prefix, names in _int8_layers(net, skip).items():
        relu = _relu_after(net, prefix)
        layer = _int8_module(net.get_submodule(prefix), fused=relu is not None)
        _load_int8(layer, prefix, names, arrays)
        if relu is not None:
            relu[0][relu[1]] = nn.Identity()  # the fused layer applies it
        if prefix:
            net.set_submodule(prefix, layer)
        else:
            net = layer  # the network is one layer
    if getattr(net, "torso_dtype", torch.float32) != torch.float32:
        net.torso_dtype = torch.float32  # int8 kernels take float32 inputs, not autocast's bf16
    return net.eval().requires_grad_(False)


def _floats(arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state entries of ``arrays`` that are not int8 weights, floats as float32."""
    return {
        name: a.float() if a.is_floating_point() else a
        for name, a in arrays.items()
        if "#" not in name and f"{name}#scale" not in arrays
    }


def _int8_prefixes(net: nn.Module) -> set[str]:
    return {name for name, m in net.named_modules() if isinstance(m, nnqd.Linear | nnqd.LSTMCell)}


def _load_int8(layer: nn.Module, prefix: str, names: tuple[str, ...], arrays: dict) -> None:
    """Packs ``prefix``'s int8 weights and float biases from ``arrays`` into ``layer``, a
    dynamically quantized Linear or LSTMCell that ``_int8_module`` made."""
    weights = {w: _qweight(arrays, _join(prefix, w)) for w in names}
    with _quiet():
        if isinstance(layer, nnqd.Linear):
            bias = arrays.get(_join(prefix, "bias"))
            layer._packed_params.set_weight_bias(weights["weight"], bias)
            return
        layer.bias_ih = arrays[_join(prefix, "bias_ih")].float()
        layer.bias_hh = arrays[_join(prefix, "bias_hh")].float()
        pack = torch.ops.quantized.linear_prepack
        layer._packed_weight_ih = pack(weights["weight_ih"], layer.bias_ih)
        layer._packed_weight_hh = pack(weights["weight_hh"], layer.bias_hh)


def _qweight(arrays: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    scale, zero_point = arrays[f"{name}#scale"], arrays[f"{name}#zero_point"]
    with _quiet():
        return torch._make_per_channel_quantized_tensor(
            arrays[name], scale.double(), zero_point.long(), 0
        )


def _relu_after(net: nn.Module, prefix: str) -> tuple[nn.Sequential, int] | None:
    """The Sequential holding layer ``prefix`` and the index of the ReLU right after it, if
    one follows (an MLP's hidden layers)."""
    parent, _, index = prefix.rpartition(".")
    if not index.isdigit():
        return None
    sequence, after = net.get_submodule(parent), int(index) + 1
    fused = isinstance(sequence, nn.Sequential) and after < len(sequence)
    return (sequence, after) if fused and type(sequence[after]) is nn.ReLU else None


def _int8_module(module: nn.Module, fused: bool = False) -> nn.Module:
    """The dynamically quantized counterpart of ``module``, shaped alike, for ``_load_int8``
    to fill; ``fused``: a Linear that applies the ReLU after it in the same kernel (fbgemm's
    linear+ReLU): one op and one pass over the activations fewer per hidden layer."""
    with _quiet():
        if isinstance(module, nn.Linear):
            kind = nniqd.LinearReLU if fused else nnqd.Linear
            return kind(module.in_features, module.out_features, module.bias is not None)
        return nnqd.LSTMCell(module.input_size, module.hidden_size)


def _unpack(
    payload: memoryview, template: nn.Module, skip: tuple[str, ...]
) -> tuple[str, int, dict[str, torch.Tensor]]:
    """Precision, version and arrays of ``payload``, every size checked before use."""
    header, data = _header(payload)
    precision, version, listed = header["precision"], header["version"], header["arrays"]
    expected = _layout(template, precision, skip)
    if listed != expected:
        raise PolicyPayloadError(
            f"policy payload is for another network: {_difference(listed, expected)}"
        )
    sizes = [math.prod(shape) * _DTYPES[dtype][1].itemsize for _, dtype, shape in expected]
    if len(data) != sum(sizes):
        raise PolicyPayloadError(
            f"policy payload has {len(data)} bytes of arrays, the header lists {sum(sizes)}"
        )
    arrays, offset = {}, 0
    for (name, dtype, shape), size in zip(expected, sizes, strict=True):
        flat = np.frombuffer(data, _DTYPES[dtype][1], math.prod(shape), offset)
        arrays[name] = torch.from_numpy(flat.reshape(shape).copy())
        offset += size
    return precision, version, arrays


def _header(payload: memoryview) -> tuple[dict[str, Any], memoryview]:
    """The checked JSON header of ``payload`` and the array bytes after it."""
    if len(payload) < _PREFIX.size:
        raise PolicyPayloadError(f"policy payload truncated: {len(payload)} bytes")
    magic, form, size, crc = _PREFIX.unpack_from(payload)
    if magic != _MAGIC:
        raise PolicyPayloadError("not a seedbed policy payload (bad magic bytes)")
    if form != _FORMAT:
        raise PolicyPayloadError(f"policy payload format {form}; this seedbed reads {_FORMAT}")
    rest = payload[_PREFIX.size :]
    if size > min(len(rest), _MAX_HEADER):
        raise PolicyPayloadError(
            f"policy payload truncated: header of {size} bytes, {len(rest)} left"
        )
    if zlib.crc32(rest) != crc:
        raise PolicyPayloadError("policy payload corrupted or truncated: checksum mismatch")
    try:
        header = json.loads(bytes(rest[:size]))
        precision, version, _ = (header[key] for key in ("precision", "version", "arrays"))
    except KeyError as e:
        raise PolicyPayloadError(f"policy payload header unreadable: no {e}") from None
    except (ValueError, TypeError) as e:
        raise PolicyPayloadError(f"policy payload header unreadable: {e}") from None
    if precision not in PRECISIONS or type(version) is not int or version < 0:
        raise PolicyPayloadError(
            f"policy payload header invalid: precision {precision!r:.20}, version {version!r:.20}"
        )
    return header, rest[size:]


def _difference(listed: Any, expected: list[list[Any]]) -> str:
    """The first way the payload's array list differs from this network's, in words."""
    if not isinstance(listed, list):
        return "no array list"
    for i, want in enumerate(expected):
        got = listed[i] if i < len(listed) else None
        if got != want:
            return f"array {i} is {_describe(got)} in the payload, {_describe(want)} here"
    return f"{len(listed) - len(expected)} arrays more than this network has"


def _describe(entry: Any) -> str:
    if isinstance(entry, list) and len(entry) == 3:
        return f"'{entry[0]}' {entry[1]} {entry[2]}"[:200]
    return "missing" if entry is None else "malformed"


def _leaves(output: Any) -> list[torch.Tensor]:
    """The floating tensors in a forward's output, in order (tuples, lists and dicts)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, tuple | list):
        return [leaf for item in output for leaf in _leaves(item)]
    return []


def _to(args: tuple, device: torch.device) -> tuple:
    """``args`` on ``device``: what has a ``to`` (tensors, a StepInput), and tuples of those
    (a recurrent state)."""
    return tuple(
        _to(a, device) if isinstance(a, tuple) else a.to(device) if hasattr(a, "to") else a
        for a in args
    )


def _device(net: nn.Module) -> torch.device:
    return next((p.device for p in net.parameters()), torch.device("cpu"))
