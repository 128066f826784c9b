"""Simulated ranks: every rank of a world runs one after another in this process.

For world sizes far beyond the machine (up to 1024 and more) when the loader needs no real
collectives. Each rank sees an initialised default group on torch's ``fake`` backend, so factories
that read ``torch.distributed.get_rank()`` work. Any real collective (all_reduce, broadcast, ...) is
refused with :class:`NeedsCollectives` and the simulation stops: a fake result would be a lie.
Module-level code of the user's file runs once, not once per rank, and a seeded permutation that
every rank draws identically is computed once (:mod:`ddpcheck.launch.shared_work`).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from ddpcheck.launch.group import GroupResult, RankOutcome
from ddpcheck.launch.rank import fresh_random_state
from ddpcheck.launch.shared_work import shared_permutations

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv",
)  # fmt: skip


class NeedsCollectives(RuntimeError):
    """The loader called a collective, which a simulated rank cannot answer truthfully."""

    harness_error = True  # about ddpcheck's mode, not the user's code: never re-wrapped


@contextlib.contextmanager
def collectives_forbidden() -> Iterator[None]:
    from torch.distributed import distributed_c10d

    saved: list[tuple[Any, str, Any]] = []

    def refuse(name: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise NeedsCollectives(
                f"the loader calls torch.distributed.{name}, which --simulate cannot answer; "
                "run without --simulate (real gloo ranks)"
            )

        return refused

    for module in (dist, distributed_c10d):
        for name in COLLECTIVES:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, refuse(name))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def simulate_ranks(
    target: Callable[..., Any], world_size: int, *, kwargs: dict[str, Any] | None = None
) -> GroupResult:
    """Run ``target(**kwargs)`` once per rank in this process; raises NeedsCollectives if it needs peers."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("--simulate needs a process without a default process group")
    started = time.monotonic()
    outcomes: list[RankOutcome] = []
    with collectives_forbidden(), shared_permutations():
        for rank in range(world_size):
            fresh_random_state()
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            try:
                outcomes.append(RankOutcome(rank=rank, kind="ok", value=target(**(kwargs or {}))))
            except NeedsCollectives:
                raise
            except Exception as exc:
                outcomes.append(
                    RankOutcome(
                        rank=rank,
                        kind="error",
                        message=str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                        error="".join(traceback.format_exception(exc)),
                        exc_type=type(exc).__name__,
                    )
                )
            finally:
                dist.destroy_process_group()
    return GroupResult(world_size, "simulated", outcomes, time.monotonic() - started)
