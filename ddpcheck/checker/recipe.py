"""How a rank builds its loader: a frozen :class:`LoaderRecipe`, made once from the run's options.

Every rank-side run (recording, the metric and training scenarios, resume) opens its loader from a
recipe (:func:`ddpcheck.checker.face.open_loader`), so none rebuilds the options field by field and
none can drop one (``--factory-arg`` once never reached the scenarios' factories that way).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ddpcheck.checker.index_log import adopt, catch_all
from ddpcheck.checker.loaderfile import (
    BadLoaderFile,
    LoaderSpec,
    call_factory,
    factory_kwargs,
    get_factory,
    load_module,
    unwrap_loader,
)
from ddpcheck.layout import Layout

if TYPE_CHECKING:
    from ddpcheck.checker.options import CheckOptions

FactoryArgs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class RecordOptions:
    """How a rank runs the loader. Plain data: it travels to ranks."""

    epochs: int = 2
    load_data: bool = False
    set_epoch: bool = True
    patch: bool = False
    batch_size: int | None = None  # passed to factories that take ``batch_size``
    steps: int | None = None  # per rank per window: one continuing iterator, cut into ``epochs`` windows
    ids_from_data: bool = False  # map-style too: ids from the batches (a field), not dataset indices
    factory_args: FactoryArgs = ()  # --factory-arg KEY=VALUE, passed by name
    layout: Layout | None = None  # the ranks' layout (a device mesh); None: a plain world size
    digest: bool = False  # digest every batch's content (replicas of a mesh must receive identical batches)
    work: bool = True  # measure each batch's work when batches carry tokens (ddpcheck.checker.work)
    work_cost: str = "tokens"  # "tokens" | "attention" (each document's length squared)
    mixture: bool = True  # read each sample's source when batches carry one (ddpcheck.checker.mixture)


@dataclass(frozen=True)
class LoaderRecipe:
    """How to build one loader in a rank, and how a training loop treats it. Plain data: it travels.

    ``spec``: the loader file and its factory; ``factory_args``: ``--factory-arg`` values, by name;
    ``patch``: shard a plain loader with the reference patcher; ``set_epoch``: call ``set_epoch`` before
    every epoch (the file's hook, else the loader's or its parts'); ``batch_size``: offered to factories
    that take one; ``layout``: the ranks' layout (None: a plain world size); ``num_workers``: offered to
    the factory as ``num_workers`` (a resume rebuilt with other workers); ``hooks``: a file whose hooks
    are used in place of the loader file's ("" for the loader file's own); ``ids_from_data``: identify
    samples by their data even where dataset indices exist.

    Make it with :meth:`from_options` (a run's options) or :meth:`of` (a rank's record options), and
    change it with :meth:`evolve`; never field by field.
    """

    spec: LoaderSpec
    factory_args: FactoryArgs = ()
    patch: bool = False
    set_epoch: bool = True
    batch_size: int | None = None
    layout: Layout | None = None
    num_workers: int | None = None
    hooks: str = ""
    ids_from_data: bool = False

    @property
    def factory(self) -> str:
        return self.spec.factory

    @classmethod
    def of(cls, spec: LoaderSpec, options: RecordOptions) -> LoaderRecipe:
        """The recipe a rank's record options describe (the one place their building fields are read)."""
        return cls(
            spec=spec,
            factory_args=tuple(options.factory_args),
            patch=options.patch,
            set_epoch=options.set_epoch,
            batch_size=options.batch_size,
            layout=options.layout,
            ids_from_data=options.ids_from_data,
        )

    @classmethod
    def from_options(
        cls, spec: LoaderSpec, options: CheckOptions, layout: Layout | None = None
    ) -> LoaderRecipe:
        """The recipe of a run's options (through ``CheckOptions.record_options``), in ``layout``."""
        return cls.of(spec, options.record_options(layout))

    def evolve(self, **changes: Any) -> LoaderRecipe:
        """This recipe with ``changes`` (``layout=``, ``batch_size=``, ...); everything else kept."""
        return replace(self, **changes)

    def arguments(self) -> FactoryArgs:
        """What the factory is given by name beyond what ddpcheck supplies: ``--factory-arg`` values,
        then ``num_workers`` when the recipe sets it."""
        if self.num_workers is None:
            return self.factory_args
        return (*self.factory_args, ("num_workers", self.num_workers))


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


def factory_offer(recipe: LoaderRecipe, factory: Any, rank: int, world_size: int) -> dict[str, Any]:
    """The keywords offered to the factory: ranks and layout, ``batch_size``, the recipe's arguments
    (each one the factory must take), and a real ``mesh`` only when it takes one."""
    layout = layout_of(recipe.layout, world_size)
    available: dict[str, Any] = {
        "rank": rank,
        "world_size": world_size,
        "dp_rank": layout.dp_rank(rank),
        "dp_world_size": layout.dp_world_size,
        "mesh": _MeshWanted(),
    }
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


def build(recipe: LoaderRecipe, rank: int, world_size: int, *, fresh: bool = False) -> tuple[Any, ModuleType]:
    """Import the file, call the factory (patching when asked); returns (what it returned, module).

    What the factory returns may be a framework wrapper around a DataLoader (Accelerate's
    ``DataLoaderShard``, Lightning Fabric's loader): that object is what a training loop iterates.
    ``fresh`` runs the file's code again, as a restarted process would.
    """
    module = load_module(recipe.spec, fresh=fresh)
    factory = get_factory(module, recipe.spec)
    available = factory_offer(recipe, factory, rank, world_size)
    with catch_all() as early:  # iterators the factory itself starts (one kept for every epoch)
        loader = call_factory(factory, available)
    adopt(unwrap_loader(loader), early)
    if recipe.patch:
        from ddpcheck.reference.patch import patch_dataloader_to_ddp

        layout = layout_of(recipe.layout, world_size)
        replicas, replica = layout.dp_world_size, layout.dp_rank(rank)
        loader = patch_dataloader_to_ddp(unwrap_loader(loader), num_replicas=replicas, rank=replica)
    return loader, module


def build_loader(
    spec: LoaderSpec, options: RecordOptions, rank: int, world_size: int, *, fresh: bool = False
) -> tuple[Any, ModuleType]:
    """:func:`build` of the recipe ``options`` describe (kept for callers that hold record options)."""
    return build(LoaderRecipe.of(spec, options), rank, world_size, fresh=fresh)
