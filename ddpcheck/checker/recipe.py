"""How a rank builds its loader: a frozen :class:`LoaderRecipe`, made once from the run's options.

Every rank-side run (recording, the metric and training scenarios, resume) opens its loader from a
recipe (:func:`ddpcheck.checker.face.open_loader`), so none rebuilds the options field by field and
none can drop one (``--factory-arg`` once never reached the scenarios' factories that way). A data
run's :class:`RecordOptions` hold the recipe beside how its epochs are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from ddpcheck.checker.index_log import adopt, catch_all
from ddpcheck.checker.loaderfile import (
    BadLoaderFile,
    FactoryCall,
    LoaderSpec,
    call_factory,
    factory_kwargs,
    get_factory,
    load_module,
    unwrap_loader,
)
from ddpcheck.layout import Layout
from ddpcheck.options import IGNORE_INDEX

if TYPE_CHECKING:
    from ddpcheck.options import CheckOptions

FactoryArgs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class LoaderRecipe:
    """How to build one loader in a rank, and how a training loop treats it. Plain data: it travels.

    ``spec``: the loader file and its factory; ``factory_args``: ``--factory-arg`` values, by name;
    ``patch``: shard a plain loader with the reference patcher; ``set_epoch``: call ``set_epoch`` before
    every epoch (the file's hook, else the loader's or its parts'); ``batch_size``: offered to factories
    that take one; ``layout``: the ranks' layout (None: a plain world size); ``num_workers``: offered to
    the factory as ``num_workers`` (a resume rebuilt with other workers); ``ids_from_data``: identify
    samples by their data even where dataset indices exist.

    Make it with :meth:`from_options` (a run's options) and change it with :meth:`evolve`; never field by
    field.
    """

    spec: LoaderSpec
    factory_args: FactoryArgs = ()
    patch: bool = False
    set_epoch: bool = True
    batch_size: int | None = None
    layout: Layout | None = None
    num_workers: int | None = None
    ids_from_data: bool = False

    @property
    def factory(self) -> str:
        return self.spec.factory

    @classmethod
    def from_options(
        cls, spec: LoaderSpec, options: CheckOptions, layout: Layout | None = None
    ) -> LoaderRecipe:
        """The recipe of a run's options in ``layout``: every field the options share with it, by name
        (the one place a run's options become how a loader is built)."""
        names = [f.name for f in fields(cls) if f.name not in ("spec", "layout") and hasattr(options, f.name)]
        shared = {name: getattr(options, name) for name in names}  # num_workers: no option of a run
        shared["factory_args"] = tuple(options.factory_args)
        return cls(spec=spec, layout=layout, **shared)

    def evolve(self, **changes: Any) -> LoaderRecipe:
        """This recipe with ``changes`` (``layout=``, ``batch_size=``, ...); everything else kept."""
        return replace(self, **changes)

    def arguments(self) -> FactoryArgs:
        """What the factory is given by name beyond what ddpcheck supplies: ``--factory-arg`` values,
        then ``num_workers`` when the recipe sets it."""
        if self.num_workers is None:
            return self.factory_args
        return (*self.factory_args, ("num_workers", self.num_workers))


@dataclass(frozen=True)
class RecordOptions:
    """How a rank records its loader: ``recipe``, how the loader is built, and how its epochs are run and
    measured. Plain data: it travels to ranks. Made by :func:`record_options`."""

    recipe: LoaderRecipe
    epochs: int = 2
    load_data: bool = False
    steps: int | None = None  # per rank per window: one continuing iterator, cut into ``epochs`` windows
    digest: bool = False  # digest every batch's content (replicas of a mesh must receive identical batches)
    work: bool = True  # measure each batch's work when batches carry tokens (ddpcheck.checker.work)
    work_cost: str = "tokens"  # "tokens" | "attention" (each document's length squared)
    ignore_index: int = IGNORE_INDEX  # the label value that supervises nothing (supervised counts)
    mixture: bool = True  # read each sample's source when batches carry one (ddpcheck.checker.mixture)


def record_options(
    spec: LoaderSpec, options: CheckOptions, layout: Layout | None = None, *, digest: bool = False
) -> RecordOptions:
    """What a data run's ranks need of a run's options, in ``layout``: the recipe and every field the
    record options share with the run's, by name."""
    own = ("recipe", "digest")
    shared = {f.name: getattr(options, f.name) for f in fields(RecordOptions) if f.name not in own}
    return RecordOptions(LoaderRecipe.from_options(spec, options, layout), digest=digest, **shared)


MESH_DEVICE = {"nccl": "cuda"}  # the device type init_device_mesh takes for a backend (else cpu)


class _MeshWanted:
    """Stands in for ``mesh`` among a factory's keywords until it is known the factory takes it: a
    DeviceMesh creates process groups, which only a factory that uses one should pay for."""


def device_mesh(layout: Layout) -> Any:
    """A real ``DeviceMesh`` of ``layout`` over the initialised default group (its names, its shape)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = MESH_DEVICE.get(str(dist.get_backend()), "cpu") if dist.is_initialized() else "cpu"
    return init_device_mesh(device, layout.shape, mesh_dim_names=layout.names)


def layout_of(layout: Layout | None, world_size: int) -> Layout:
    """The layout this rank runs in; a mesh whose size is not the group's is bad input."""
    layout = layout or Layout.plain(world_size)
    if layout.world_size != world_size:
        raise BadLoaderFile(
            f"mesh {layout.spec} has {layout.world_size} ranks, but the process group has {world_size}"
        )
    return layout


def group_position() -> tuple[int, int]:
    """(rank, world size) of the initialised default group; (0, 1) outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_offer(layout: Layout, rank: int) -> dict[str, int]:
    """Where this rank stands, by the names a factory and the loader file's hooks may take: its rank and
    the world size, its data-parallel rank and the data-parallel world size."""
    return {
        "rank": rank,
        "world_size": layout.world_size,
        "dp_rank": layout.dp_rank(rank),
        "dp_world_size": layout.dp_world_size,
    }


def factory_offer(recipe: LoaderRecipe, factory: Any, rank: int, world_size: int) -> dict[str, Any]:
    """The keywords offered to the factory: ranks and layout, ``batch_size``, the recipe's arguments
    (each one the factory must take), and a real ``mesh`` only when it takes one."""
    layout = layout_of(recipe.layout, world_size)
    available: dict[str, Any] = {**rank_offer(layout, rank), "mesh": _MeshWanted()}
    if recipe.batch_size is not None:
        available["batch_size"] = recipe.batch_size
    arguments = recipe.arguments()
    if arguments:
        accepted = factory_kwargs(factory, {k: v for k, v in arguments} | available)
        refused = [k for k, _ in arguments if k not in accepted]
        if refused:
            name = getattr(factory, "__name__", "factory")
            raise BadLoaderFile(f"{name}() takes no parameter {refused[0]!r} (given with --factory-arg)")
        available.update(arguments)
    if isinstance(factory_kwargs(factory, available).get("mesh"), _MeshWanted):
        available["mesh"] = device_mesh(layout)
    else:
        del available["mesh"]
    return available


class Built(NamedTuple):
    """What :func:`build` made: what the factory returned (patched when asked), the file's module, and
    how the factory was called."""

    outer: Any
    module: ModuleType
    call: FactoryCall


def build(recipe: LoaderRecipe, rank: int, world_size: int, *, fresh: bool = False) -> Built:
    """Import the file, call the factory (patching when asked).

    What the factory returns may be a framework wrapper around a DataLoader (Accelerate's
    ``DataLoaderShard``, Lightning Fabric's loader): that object is what a training loop iterates.
    ``fresh`` runs the file's code again, as a restarted process would.
    """
    module = load_module(recipe.spec, fresh=fresh)
    factory = get_factory(module, recipe.spec)
    available = factory_offer(recipe, factory, rank, world_size)
    call = FactoryCall.of(factory, available)
    with catch_all() as early:  # iterators the factory itself starts (one kept for every epoch)
        loader = call_factory(factory, available)
    adopt(unwrap_loader(loader), early)
    if recipe.patch:
        from ddpcheck.reference.patch import patch_dataloader_to_ddp

        layout = layout_of(recipe.layout, world_size)
        replicas, replica = layout.dp_world_size, layout.dp_rank(rank)
        loader = patch_dataloader_to_ddp(unwrap_loader(loader), num_replicas=replicas, rank=replica)
    return Built(loader, module, call)
