"""`glue.nn.initializers`: parameter initializers with `jax.nn.initializers`' interface.

Each initializer is a function `init(key, shape, dtype=float32)`; the ones that take settings
(`constant`, `normal`, `variance_scaling`, ...) are factories returning one. The random ones draw
from `glue.random` (`normal`, `uniform`, `truncated_normal` with JAX's signatures), so the same
key gives the same parameters on every backend, eagerly and under jit.

`variance_scaling` reads a weight's fans as JAX does: `in_axis` and `out_axis` (ints or tuples)
are the input and output feature axes, `batch_axis` axes are neither, and every other axis is a
receptive field that multiplies both fans.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import glue.numpy as gnp
from glue.numpy import _fail

Initializer = Callable[..., Any]
# The standard deviation of a standard normal truncated to [-2, 2]: dividing by it makes the
# truncated draws have the variance asked for.
_TRUNCATED_STDDEV = 0.87962566103423978


def _random() -> Any:
    """glue.random, imported when an initializer first draws: glue.nn does not need it otherwise."""
    import glue.random

    return glue.random


def _shape(shape: Any) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(n) for n in shape)


def zeros(key: Any, shape: Any, dtype: Any = gnp.float32) -> Any:
    return gnp.zeros(_shape(shape), dtype)


def ones(key: Any, shape: Any, dtype: Any = gnp.float32) -> Any:
    return gnp.ones(_shape(shape), dtype)


def constant(value: Any, dtype: Any = gnp.float32) -> Initializer:
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Any:
        return gnp.full(_shape(shape), value, dtype)
    return init


def uniform(scale: float = 1e-2, dtype: Any = gnp.float32) -> Initializer:
    """Uniform on [0, scale)."""
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Any:
        return gnp.multiply(_random().uniform(key, _shape(shape), dtype), scale)
    return init


def normal(stddev: float = 1e-2, dtype: Any = gnp.float32) -> Initializer:
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Any:
        return gnp.multiply(_random().normal(key, _shape(shape), dtype), stddev)
    return init


def truncated_normal(stddev: float = 1e-2, dtype: Any = gnp.float32, lower: float = -2.0,
                     upper: float = 2.0) -> Initializer:
    """A standard normal truncated to [lower, upper], times `stddev`."""
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Any:
        draws = _random().truncated_normal(key, lower, upper, _shape(shape), dtype)
        return gnp.multiply(draws, stddev)
    return init


def _size(shape: tuple[int, ...], axes: int | Sequence[int]) -> int:
    return math.prod(shape[a] for a in ((axes,) if isinstance(axes, int) else axes))


def compute_fans(shape: Any, in_axis: int | Sequence[int] = -2, out_axis: int | Sequence[int] = -1,
                 batch_axis: int | Sequence[int] = ()) -> tuple[float, float]:
    """(fan_in, fan_out) of a weight of `shape` (at least 2-D)."""
    shape = _shape(shape)
    if len(shape) < 2:
        raise _fail("variance_scaling", f"a weight of shape {shape} has no input and output axes "
                                        "(it needs at least two)")
    in_size, out_size = _size(shape, in_axis), _size(shape, out_axis)
    receptive = math.prod(shape) / in_size / out_size / _size(shape, batch_axis)
    return in_size * receptive, out_size * receptive


_FAN_MODES: dict[str, Callable[[float, float], float]] = {
    "fan_in": lambda fan_in, fan_out: fan_in,
    "fan_out": lambda fan_in, fan_out: fan_out,
    "fan_avg": lambda fan_in, fan_out: (fan_in + fan_out) / 2,
    "fan_geo_avg": lambda fan_in, fan_out: math.sqrt(fan_in * fan_out),
}
_DISTRIBUTIONS = ("truncated_normal", "normal", "uniform")


def variance_scaling(scale: float, mode: str, distribution: str, in_axis: int | Sequence[int] = -2,
                     out_axis: int | Sequence[int] = -1, batch_axis: int | Sequence[int] = (),
                     dtype: Any = gnp.float32) -> Initializer:
    """Draws with variance scale / fan, fan chosen by `mode` (fan_in, fan_out, fan_avg,
    fan_geo_avg), from a truncated normal, a normal or a uniform distribution."""
    if mode not in _FAN_MODES:
        raise _fail("variance_scaling", f"mode must be one of {sorted(_FAN_MODES)}, not {mode!r}")
    if distribution not in _DISTRIBUTIONS:
        raise _fail("variance_scaling", f"distribution must be one of {_DISTRIBUTIONS}, not {distribution!r}")

    def init(key: Any, shape: Any, dtype: Any = dtype) -> Any:
        shape = _shape(shape)
        variance = scale / _FAN_MODES[mode](*compute_fans(shape, in_axis, out_axis, batch_axis))
        random = _random()
        if distribution == "truncated_normal":
            draws = random.truncated_normal(key, -2.0, 2.0, shape, dtype)
            return gnp.multiply(draws, math.sqrt(variance) / _TRUNCATED_STDDEV)
        if distribution == "normal":
            return gnp.multiply(random.normal(key, shape, dtype), math.sqrt(variance))
        return gnp.multiply(random.uniform(key, shape, dtype, -1.0, 1.0), math.sqrt(3 * variance))
    return init


def _scaled(scale: float, mode: str, distribution: str) -> Callable[..., Initializer]:
    def factory(in_axis: int | Sequence[int] = -2, out_axis: int | Sequence[int] = -1,
                batch_axis: int | Sequence[int] = (), dtype: Any = gnp.float32) -> Initializer:
        return variance_scaling(scale, mode, distribution, in_axis, out_axis, batch_axis, dtype)
    factory.__doc__ = f"variance_scaling({scale}, {mode!r}, {distribution!r}, ...)"
    return factory


glorot_normal = xavier_normal = _scaled(1.0, "fan_avg", "truncated_normal")
glorot_uniform = xavier_uniform = _scaled(1.0, "fan_avg", "uniform")
lecun_normal = _scaled(1.0, "fan_in", "truncated_normal")
lecun_uniform = _scaled(1.0, "fan_in", "uniform")
he_normal = kaiming_normal = _scaled(2.0, "fan_in", "truncated_normal")
he_uniform = kaiming_uniform = _scaled(2.0, "fan_in", "uniform")
