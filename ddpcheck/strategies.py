"""Hypothesis strategies for property tests of DDP samplers: small composable functions.

They draw :class:`~ddpcheck.testing.LoaderConfig` examples (dataset length, world size, batching,
seed, padding) that :func:`ddpcheck.testing.assert_sampler_ok` checks a sampler under::

    @given(config=loader_configs())
    def test_my_sampler(config):
        assert_sampler_ok(lambda rank, world_size, seed: MySampler(..., rank=rank, num_replicas=world_size,
                                                                   seed=seed), config)

The in-process checker lives in :mod:`ddpcheck.testing`; its names are importable from here too.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ddpcheck.strategies needs hypothesis: pip install 'ddpcheck[test]' (or pip install hypothesis)"
    ) from exc

# Imported here, not on first use: the first hypothesis example must not pay for importing torch
# (it would blow hypothesis's deadline and make that example look flaky).
from ddpcheck.testing import (
    MAX_SEED,
    LoaderConfig,
    SamplerCheckFailed,
    SamplerFactory,
    assert_sampler_ok,
    check_sampler,
    record_simulated,
)

__all__ = [
    "LoaderConfig",
    "SamplerCheckFailed",
    "SamplerFactory",
    "assert_sampler_ok",
    "batch_shapes",
    "batch_sizes",
    "check_sampler",
    "dataset_lengths",
    "loader_configs",
    "record_simulated",
    "world_sizes",
]

T = TypeVar("T")


def _positive_range(name: str, low: int, high: int) -> None:
    if (
        not isinstance(low, int)
        or not isinstance(high, int)
        or isinstance(low, bool)
        or isinstance(high, bool)
    ):
        raise TypeError(f"{name}: bounds must be integers, got {low!r} and {high!r}")
    if low < 0 or high < low:
        raise ValueError(f"{name}: need 0 <= min <= max, got min={low}, max={high}")


def dataset_lengths(min_value: int = 1, max_value: int = 200) -> st.SearchStrategy[int]:
    """Dataset sizes in ``[min_value, max_value]``; shrinks towards ``min_value``.

    The default range holds the sizes where DDP bugs show (fewer samples than ranks, sizes that do
    not divide by the world size or batch size) while keeping every example cheap to check.
    """
    _positive_range("dataset_lengths", min_value, max_value)
    return st.integers(min_value=min_value, max_value=max_value)


def _bounds(
    name: str,
    args: tuple[int, ...],
    min_value: int | None,
    max_value: int | None,
    old: dict[str, int | None],
    default: tuple[int, int],
) -> tuple[int, int]:
    """``min_value``/``max_value`` as hypothesis takes them; the old ``max_size``/``min_size`` keywords and
    positional ``(max, min)`` still work, with a DeprecationWarning."""
    if len(args) > 2:
        raise TypeError(f"{name}() takes min_value= and max_value=, got {len(args)} positional arguments")
    legacy = dict(zip(("max_size", "min_size"), args, strict=False))
    for key, value in old.items():
        if value is not None:
            if key in legacy:
                raise TypeError(f"{name}() got {key} twice")
            legacy[key] = value
    if legacy:
        if min_value is not None or max_value is not None:
            raise TypeError(f"{name}(): give min_value/max_value or the old max_size/min_size, not both")
        shown = ", ".join(f"{k}={v!r}" for k, v in legacy.items())
        warnings.warn(
            f"{name}({shown}) is deprecated: pass min_value= and max_value= as hypothesis does "
            f"({name}(min_value=..., max_value=...))",
            DeprecationWarning,
            stacklevel=3,
        )
        min_value, max_value = legacy.get("min_size"), legacy.get("max_size")
    low = default[0] if min_value is None else min_value
    high = default[1] if max_value is None else max_value
    _positive_range(name, low, high)
    if low < 1:
        raise ValueError(f"{name}: min_value must be at least 1, got {low}")
    return low, high


def world_sizes(
    *args: int,
    min_value: int | None = None,
    max_value: int | None = None,
    max_size: int | None = None,
    min_size: int | None = None,
) -> st.SearchStrategy[int]:
    """Numbers of ranks in ``[min_value, max_value]`` (default 1 to 16); shrinks towards ``min_value``.

    ``max_size``/``min_size`` (and positional ``(max, min)``) are the old names: deprecated.
    """
    old = {"max_size": max_size, "min_size": min_size}
    low, high = _bounds("world_sizes", args, min_value, max_value, old, (1, 16))
    return st.integers(min_value=low, max_value=high)


def batch_sizes(
    *args: int,
    min_value: int | None = None,
    max_value: int | None = None,
    max_size: int | None = None,
    min_size: int | None = None,
) -> st.SearchStrategy[int]:
    """DataLoader batch sizes in ``[min_value, max_value]`` (default 1 to 32); shrinks towards
    ``min_value``. ``max_size``/``min_size`` (and positional ``(max, min)``) are the old names: deprecated.
    """
    old = {"max_size": max_size, "min_size": min_size}
    low, high = _bounds("batch_sizes", args, min_value, max_value, old, (1, 32))
    return st.integers(min_value=low, max_value=high)


def _strategy(value: T | st.SearchStrategy[T] | None, default: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    if value is None:
        return default
    if isinstance(value, st.SearchStrategy):
        return value
    return st.just(value)


def loader_configs(
    *,
    dataset_len: int | st.SearchStrategy[int] | None = None,
    world_size: int | st.SearchStrategy[int] | None = None,
    batch_size: int | st.SearchStrategy[int] | None = None,
    drop_last: bool | st.SearchStrategy[bool] | None = None,
    shuffle: bool | st.SearchStrategy[bool] | None = None,
    seed: int | st.SearchStrategy[int] | None = None,
    pad: bool | st.SearchStrategy[bool] | None = None,
) -> st.SearchStrategy[LoaderConfig]:
    """:class:`LoaderConfig` examples; each field is drawn from its default strategy unless given.

    A field may be fixed (``world_size=4``) or drawn from any strategy
    (``world_size=world_sizes(max_value=64)``).
    Defaults: :func:`dataset_lengths`, :func:`world_sizes`, :func:`batch_sizes`, booleans for
    ``drop_last``, ``shuffle`` and ``pad``, and seeds in ``[0, 2**32 - 1]``. Shrinks towards one
    sample, one rank, batch size 1, no shuffle and seed 0.
    """
    return st.builds(
        LoaderConfig,
        dataset_len=_strategy(dataset_len, dataset_lengths()),
        world_size=_strategy(world_size, world_sizes()),
        batch_size=_strategy(batch_size, batch_sizes()),
        drop_last=_strategy(drop_last, st.booleans()),
        shuffle=_strategy(shuffle, st.booleans()),
        seed=_strategy(seed, st.integers(min_value=0, max_value=MAX_SEED)),
        pad=_strategy(pad, st.booleans()),
    )


@st.composite
def _shapes_summing_to(draw: st.DrawFn, total: int, max_batch_size: int) -> list[int]:
    shapes: list[int] = []
    left = total
    while left > 0:
        size = draw(st.integers(min_value=1, max_value=min(max_batch_size, left)))
        shapes.append(size)
        left -= size
    return shapes


def batch_shapes(
    total: int | st.SearchStrategy[int] | None = None,
    *,
    max_batch_size: int = 16,
    max_batches: int = 32,
) -> st.SearchStrategy[list[int]]:
    """Lists of batch sizes, for building custom batch samplers: ``[4, 4, 3, 1]``.

    With ``total`` (a number or a strategy for one) the sizes add up to exactly ``total`` samples, so
    cutting ``range(total)`` by them uses every index once (``total=0`` gives ``[]``); without it, 1 to
    ``max_batches`` batches. Every size is in ``[1, max_batch_size]``; shrinks towards few, small batches.
    """
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"batch_shapes: max_batch_size must be a positive integer, got {max_batch_size!r}")
    if total is None:
        if not isinstance(max_batches, int) or max_batches < 1:
            raise ValueError(f"batch_shapes: max_batches must be a positive integer, got {max_batches!r}")
        return st.lists(st.integers(min_value=1, max_value=max_batch_size), min_size=1, max_size=max_batches)
    totals = total if isinstance(total, st.SearchStrategy) else st.just(total)
    if isinstance(total, int) and (isinstance(total, bool) or total < 0):
        raise ValueError(f"batch_shapes: total must be a non-negative integer, got {total!r}")
    return totals.flatmap(lambda n: _shapes_summing_to(n, max_batch_size))
