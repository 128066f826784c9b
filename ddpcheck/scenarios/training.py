"""Training equivalence: DDP with W ranks x batch b must train like one process with batch b * W.

Why: DDP averages gradients over ranks, so its step equals a single-process step over the union of
the ranks' batches, but only when that union *is* the single-process batch: a strided split
(``DistributedSampler``) gives that, contiguous blocks per rank or re-formed batches do not, and
nothing crashes. This trains both ways and compares the weights after every step.

Hooks (both needed; the check runs when the file defines them, read from its source)::

    def make_model() -> torch.nn.Module: ...       # same architecture every call
    def loss(model, batch) -> torch.Tensor: ...    # a scalar: the *mean* over the batch
    # or a token-weighted pair: (sum of the token losses, number of tokens)

A ``(sum, count)`` pair is trained as the usual step does it: each rank divides by its own count. Where
that diverges from one process (which divides by the global count) and dividing by the count summed over
ranks does not, the cause is named: the loss is normalised locally. Gradient accumulation is not compared
for pairs (its normalisation spans micro-batches).

and the factory should take ``batch_size`` (``make_loader(rank, world_size, batch_size=4)``): the
single-process loader is the same factory at world size 1 with ``batch_size = b * W``. Without that
parameter a plain loader (``DataLoader(batch_size=...)``) is rebuilt with the larger batch; a custom
batch sampler makes the check skip.

How: the run is float64 (the model is ``.double()``'d and floating tensors of each batch cast),
plain SGD (lr 0.1, no momentum), every global RNG seeded with 0 before the loader and the model are
built, gloo ranks whatever ``--backend`` says, epoch 0. The DDP model is the reference
``wrap_model``; the single-process model starts from rank 0's initial weights in its own one-rank
group. ``--train-steps`` steps (default 3; 0 turns the check off) are compared; the relative
difference of a step is ``max|w_ddp - w_one| / max|w_one|`` over all parameters.

Gradient accumulation is part of the same verdict: a second DDP model accumulates
:data:`ACCUMULATION` micro-batches per step with the reference ``no_sync`` (each micro-batch loss
divided by the count) and must match one process with batch ``b * W * ACCUMULATION``. The verdict's
``data`` holds both per-step difference lists and the first step where they part.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.face import OpenedLoader, open_loader
from ddpcheck.checker.loaderfile import LoaderSpec
from ddpcheck.checker.recipe import LoaderRecipe, group_position
from ddpcheck.checks.training import ACCUMULATION, TOLERANCE, Batches, TrainingRun, judge_training
from ddpcheck.launch import GroupCall, TargetRef, report_progress, run_ranks
from ddpcheck.layout import Layout, shaped_like
from ddpcheck.scenarios.protocol import DataRun, Outcome, rank_failures
from ddpcheck.verdict import TRAINING_EQUIVALENCE, skipped

if TYPE_CHECKING:
    import torch

    from ddpcheck.options import CheckOptions

TRAIN_HOOKS = ("make_model", "loss")
LEARNING_RATE = 0.1
SEED = 0
SIMULATE_SKIP = "needs real gloo ranks (DDP all-reduces gradients); run without --simulate"


@dataclass(frozen=True)
class TrainOptions:
    """How ranks train. Plain data: it travels to ranks.

    ``recipe`` is how a rank builds its loader: the data run's own (:meth:`LoaderRecipe.from_options`,
    the group's layout), never a copy rebuilt field by field, so the loader trained is the one the data
    checks judged (``--factory-arg`` included).
    """

    recipe: LoaderRecipe
    steps: int = 3
    accumulation: int = ACCUMULATION
    lr: float = LEARNING_RATE
    seed: int = SEED
    single: Layout | None = None  # the single process's layout (shaped like the meshes)


@dataclass(frozen=True)
class RankTraining:
    """One DDP rank's run; weights and the initial state only on rank 0 (DDP keeps ranks equal)."""

    rank: int
    skip: str = ""
    batch_size: int = 0  # per-rank batch b
    steps: int = 0  # plain DDP steps, agreed by every rank
    accumulated_steps: int = 0
    batch_ids: Batches = ()  # this rank's batches, in order
    init: dict[str, Any] | None = None
    weights: tuple[Any, ...] = ()  # flat float64 weights after each plain step
    accumulated: tuple[Any, ...] = ()  # ... after each accumulated step
    pair: bool = False  # the loss hook returns (sum, count)
    global_weights: tuple[Any, ...] = ()  # pairs: each rank's sum divided by the count over all ranks


@dataclass(frozen=True)
class ReferenceTraining:
    """The single-process run with batch b * W (and b * W * accumulation)."""

    skip: str = ""
    batch_ids: Batches = ()
    accumulated_ids: Batches = ()
    weights: tuple[Any, ...] = ()
    accumulated: tuple[Any, ...] = ()


# --------------------------------------------------------------------------- rank side helpers


def seed_everything(seed: int) -> None:
    """Python, numpy and torch global RNGs seeded alike in every process of both runs."""
    import sys

    import torch

    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    torch.manual_seed(seed)


def to_double(obj: Any) -> Any:
    """``obj`` with every floating tensor cast to float64; containers keep their types."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.double() if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return type(obj)({k: to_double(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_double(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_double(v) for v in obj)
    return obj


def build_model(make_model: Callable[[], Any]) -> torch.nn.Module:
    from torch import nn

    model = make_model()
    if not isinstance(model, nn.Module):
        raise TypeError(f"make_model() must return a torch.nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("make_model() returned a model without trainable parameters: nothing to train")
    return model.double()


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    import torch

    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


LOCAL, GLOBAL = "local", "global"


def _is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def _loss(loss_fn: Callable[..., Any], model: Any, batch: Any, normalise: str = LOCAL) -> torch.Tensor:
    import torch

    value = loss_fn(model, batch)
    if _is_pair(value):  # (sum, count): divided by this rank's count, or by the count over all ranks
        total, count = value
        count = float(count.detach() if isinstance(count, torch.Tensor) else count)
        if normalise == GLOBAL:
            import torch.distributed as dist

            summed = torch.tensor([count], dtype=torch.float64)
            dist.all_reduce(summed)
            value = total * dist.get_world_size() / max(float(summed.item()), 1.0)
        else:
            value = total / max(count, 1.0)
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        raise TypeError(
            "loss(model, batch) must return a scalar tensor computed from the model's output (or a pair "
            f"(sum, count)), got {type(value).__name__}"
        )
    return value.reshape(())


def train_steps(
    model: torch.nn.Module,
    loss_fn: Callable[..., Any],
    batches: Sequence[Any],
    accumulation: int,
    lr: float,
    normalise: str = LOCAL,
) -> tuple[torch.Tensor, ...]:
    """Plain SGD over ``batches``, ``accumulation`` micro-batches per step (all but the last under
    ``no_sync``); the flat weights after every step. Works on DDP and plain modules alike."""
    import torch

    from ddpcheck.reference.model import no_sync, unwrap_model

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    weights = []
    for step in range(len(batches) // accumulation):
        optimizer.zero_grad()
        for micro in range(accumulation):
            batch = to_double(batches[step * accumulation + micro])
            quiet = no_sync(model) if micro < accumulation - 1 else contextlib.nullcontext()
            with quiet:
                (_loss(loss_fn, model, batch, normalise) / accumulation).backward()
        optimizer.step()
        weights.append(flat_weights(unwrap_model(model)))
        report_progress(f"training, step {step + 1}")
    return tuple(weights)


def _agree(reason: str, world_size: int) -> str:
    """Every rank's skip reason; the first non-empty one wins everywhere (no rank waits alone)."""
    import torch.distributed as dist

    if world_size == 1:
        return reason
    reasons: list[Any] = [None] * world_size
    dist.all_gather_object(reasons, reason)
    return next((r for r in reasons if r), "")


def _fewest(count: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    value = torch.tensor([count], dtype=torch.int64)
    if world_size > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def _skip_reason(opened: OpenedLoader, world_size: int) -> str:
    """Why this rank cannot train (agreed by every rank: the first reason wins everywhere)."""
    reason = ""
    if opened.hooks.make_model is None or opened.hooks.loss is None:
        reason = "the file defines no callable make_model and loss"
    elif opened.outer.batch_size is None:
        reason = "the loader has no batch_size (custom batch sampler): per-rank batch b is unknown"
    return _agree(reason, world_size)


def train_rank(options: TrainOptions) -> RankTraining:
    """Entry point inside a DDP rank: plain DDP steps, then accumulated steps, from the same init."""
    rank, world_size = group_position()
    seed_everything(options.seed)
    opened = open_loader(options.recipe, rank, world_size)
    reason = _skip_reason(opened, world_size)
    if reason:
        return RankTraining(rank, skip=reason)
    wanted = options.steps * options.accumulation
    taken = [(batch, ids) for batch, ids, _ in islice(opened.batches(0), wanted)]
    available = _fewest(len(taken), world_size)
    steps = min(options.steps, available)
    accumulated_steps = min(options.steps, available // options.accumulation)
    if steps == 0:
        return RankTraining(rank, skip="some rank's loader yields no batch")
    trained = _train_ddp(opened, options, [batch for batch, _ in taken], steps, accumulated_steps)
    used = trained.accumulated_steps * options.accumulation
    lead = rank == 0
    return replace(
        trained,
        rank=rank,
        batch_size=int(opened.outer.batch_size),
        steps=steps,
        batch_ids=tuple(tuple(ids) for _, ids in taken[: max(steps, used)]),
        init=trained.init if lead else None,
        weights=trained.weights if lead else (),
        accumulated=trained.accumulated if lead else (),
        global_weights=trained.global_weights if lead else (),
    )


def _train_ddp(
    opened: OpenedLoader, options: TrainOptions, batches: list[Any], steps: int, accumulated_steps: int
) -> RankTraining:
    """The DDP models trained from one init: plain steps, a global-count run for pairs, accumulated."""
    from torch import no_grad

    from ddpcheck.reference.model import wrap_model

    make_model, loss_fn = opened.hooks.make_model, opened.hooks.loss
    assert make_model is not None and loss_fn is not None
    model = build_model(make_model)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with no_grad():
        pair = _is_pair(loss_fn(build_model(make_model), to_double(batches[0])))
    weights = train_steps(wrap_model(model), loss_fn, batches[:steps], 1, options.lr)
    global_weights: tuple[Any, ...] = ()
    if pair:
        third = build_model(make_model)
        third.load_state_dict(init)
        global_weights = train_steps(wrap_model(third), loss_fn, batches[:steps], 1, options.lr, GLOBAL)
        accumulated_steps = 0
    second = build_model(make_model)
    second.load_state_dict(init)
    used = accumulated_steps * options.accumulation
    accumulated = train_steps(wrap_model(second), loss_fn, batches[:used], options.accumulation, options.lr)
    return RankTraining(
        rank=opened.rank,
        accumulated_steps=accumulated_steps,
        init=init,
        weights=weights,
        accumulated=accumulated,
        pair=pair,
        global_weights=global_weights,
    )


def reference_loader(options: TrainOptions, batch_size: int) -> tuple[OpenedLoader, str]:
    """The world size 1 loader with ``batch_size``: (the opened loader, skip reason)."""
    from torch.utils.data import BatchSampler, DataLoader

    from ddpcheck.reference.patch import extract_loader_parameters

    seed_everything(options.seed)
    recipe = options.recipe.evolve(batch_size=batch_size, layout=options.single)
    opened = open_loader(recipe, 0, 1)
    if "batch_size" in opened.call.took:  # the factory built the loader with batch b * W itself
        return opened, ""
    loader = opened.outer
    if type(loader.batch_sampler) is BatchSampler and loader.batch_size is not None:
        params = extract_loader_parameters(loader)
        rebuilt = DataLoader(**{**params, "batch_size": batch_size})
        wrapped = OpenedLoader.wrap(
            rebuilt, opened.hooks, set_epoch=recipe.set_epoch, ids_from_data=recipe.ids_from_data
        )
        return wrapped, ""
    why = (
        f"{recipe.factory}() takes no batch_size and its batch sampler cannot be re-batched: add a "
        "batch_size parameter so ddpcheck can build the single-process loader with batch b * W"
    )
    return opened, why


def train_reference_rank(
    options: TrainOptions, global_batch: int, steps: int, accumulated_steps: int, init: dict[str, Any]
) -> ReferenceTraining:
    """Entry point inside a one-rank group: train one process with the global batch (and its multiple)."""
    plain: list[tuple[Any, list[Hashable]]] = []
    grouped: list[tuple[Any, list[Hashable]]] = []
    hooks = None
    for size, count, into in (
        (global_batch, steps, plain),
        (global_batch * options.accumulation, accumulated_steps, grouped),
    ):
        opened, why = reference_loader(options, size)
        if why:
            return ReferenceTraining(skip=why)
        hooks = opened.hooks
        into.extend((batch, ids) for batch, ids, _ in islice(opened.batches(0), count))
    assert hooks is not None and hooks.make_model is not None and hooks.loss is not None
    results = []
    for taken in (plain, grouped):
        model = build_model(hooks.make_model)
        model.load_state_dict(init)
        results.append(train_steps(model, hooks.loss, [batch for batch, _ in taken], 1, options.lr))
    return ReferenceTraining(
        batch_ids=tuple(tuple(ids) for _, ids in plain),
        accumulated_ids=tuple(tuple(ids) for _, ids in grouped),
        weights=results[0],
        accumulated=results[1],
    )


# ------------------------------------------------ comparing (the judge: ddpcheck/checks/training.py)


def relative_difference(ddp: torch.Tensor, one: torch.Tensor) -> float:
    """``max|ddp - one| / max|one|`` (inf when the shapes differ)."""
    if ddp.shape != one.shape:
        return float("inf")
    scale = float(one.abs().max()) if one.numel() else 0.0
    diff = float((ddp - one).abs().max()) if one.numel() else 0.0
    return diff / scale if scale > 0 else diff


def compared(ranks: Sequence[RankTraining], reference: ReferenceTraining) -> TrainingRun:
    """What the judge reads of both runs: the relative weight difference after every step (rank 0's
    weights: DDP keeps the ranks equal) and the samples of every batch."""
    lead = ranks[0]

    def diffs(ours: Sequence[Any], theirs: Sequence[Any]) -> tuple[float, ...]:
        return tuple(relative_difference(a, b) for a, b in zip(ours, theirs, strict=False))

    return TrainingRun(
        batch_size=lead.batch_size,
        plain=diffs(lead.weights, reference.weights),
        accumulated=diffs(lead.accumulated, reference.accumulated),
        pair=lead.pair,
        global_count=diffs(lead.global_weights, reference.weights) if lead.pair else (),
        rank_batches=tuple(r.batch_ids for r in ranks),
        batches=reference.batch_ids,
        accumulated_batches=reference.accumulated_ids,
    )


# --------------------------------------------------------------------------- parent side


def preload_ddp() -> None:
    """Import what the first ``DistributedDataParallel(...)`` imports (torch._dynamo, ~800 modules).

    Ranks are forked from this process: importing once here saves ~2 s in every rank of every group.
    """
    import torch._dynamo  # noqa: F401


class TrainingEquivalence:
    """Parent side: per world size a DDP group, then a one-rank group with the global batch."""

    def __init__(self, spec: LoaderSpec, options: CheckOptions) -> None:
        self.spec = spec
        self.options = TrainOptions(
            recipe=LoaderRecipe.from_options(spec, options),  # the data run's, never a copy
            steps=options.train_steps,
            single=shaped_like(options.layouts, 1),
        )
        self.timeout, self.max_time = options.timeout, options.max_time
        self.simulate = options.simulate
        if not self.simulate:
            preload_ddp()

    @classmethod
    def maybe(
        cls, spec: LoaderSpec, options: CheckOptions, names: frozenset[str]
    ) -> TrainingEquivalence | None:
        """The check when the file defines ``make_model`` and ``loss`` and steps > 0, else None."""
        wanted = options.train_steps > 0 and set(TRAIN_HOOKS) <= names
        return cls(spec, options) if wanted else None

    def finish(self) -> dict[str, Outcome]:
        return {}

    def world(self, ctx: DataRun) -> Outcome:
        # on a mesh, at its data-parallel size: its replicas train one model shard, not more data
        layout = (ctx.layout or Layout.plain(ctx.world_size)).without_replicas()
        world_size = layout.world_size
        if self.simulate:
            return Outcome(verdicts=(skipped(TRAINING_EQUIVALENCE, SIMULATE_SKIP),))
        target = TargetRef.of(train_rank)
        options = replace(self.options, recipe=self.options.recipe.evolve(layout=layout))
        kwargs: dict[str, Any] = {"options": options}
        group = run_ranks(
            GroupCall(target, world_size, timeout=self.timeout, kwargs=kwargs, max_time=self.max_time)
        )
        failures = rank_failures(group, TRAINING_EQUIVALENCE)
        if not group.ok:
            return Outcome(failures=failures)
        ranks: list[RankTraining] = group.values
        lead = ranks[0]
        if lead.skip:
            return Outcome(verdicts=(skipped(TRAINING_EQUIVALENCE, lead.skip),))
        kwargs.update(
            global_batch=lead.batch_size * world_size,
            steps=lead.steps,
            accumulated_steps=lead.accumulated_steps,
            init=lead.init,
        )
        ref_group = run_ranks(
            GroupCall(
                TargetRef.of(train_reference_rank),
                1,
                timeout=self.timeout,
                kwargs=kwargs,
                max_time=self.max_time,
            )
        )
        failures = rank_failures(ref_group, TRAINING_EQUIVALENCE)
        if not ref_group.ok:
            return Outcome(failures=failures)
        reference: ReferenceTraining = ref_group.values[0]
        if reference.skip:
            return Outcome(verdicts=(skipped(TRAINING_EQUIVALENCE, reference.skip),))
        verdict = judge_training(compared(ranks, reference), world_size, TOLERANCE, self.options.accumulation)
        return Outcome(verdicts=(verdict,))
