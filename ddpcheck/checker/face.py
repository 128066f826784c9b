"""The rank side's one face: open a loader from a :class:`~ddpcheck.checker.recipe.LoaderRecipe` and
use it as a training loop would.

::

    opened = open_loader(LoaderRecipe.from_options(spec, options))   # in a rank, after the group is up
    for batch, ids, worker in opened.batches(0):                      # set_epoch(0) first, by the policy
        ...
    again = open_loader(recipe.evolve(num_workers=2), restarted=True)  # as a restarted process opens it

:class:`OpenedLoader` holds what the factory returned (``outer``: a framework wrapper where there is
one, what the loop iterates), the torch DataLoader underneath (``loader``), the file's module and hooks,
how its factory was called, and the loader's facts (read once, on first use). :meth:`OpenedLoader.wrap`
opens a loader that exists already (one a training script built) through the same face.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from types import ModuleType
from typing import Any

from ddpcheck.checker.batches import IdBatches, SamplerBatches, is_collated, settled_ids
from ddpcheck.checker.epochs import first_set_epoch, loop_set_epoch
from ddpcheck.checker.facts import read_facts
from ddpcheck.checker.hooks import LoaderHooks
from ddpcheck.checker.index_log import IndexLog, log_of
from ddpcheck.checker.loaderfile import FactoryCall, unwrap_loader
from ddpcheck.checker.recipe import LoaderRecipe, build, group_position, layout_of, rank_offer
from ddpcheck.checker.state import LoaderState, resume_mechanism
from ddpcheck.trace import LoaderFacts


class OpenedLoader:
    """One loader, opened in a rank: its module and hooks, its facts, its epochs and its batches.

    ``set_epoch(e)`` calls what a training loop calls before epoch ``e`` (when the recipe says to);
    ``batches(e)`` and ``indices(e)`` set the epoch first unless it was just set to ``e`` (so an epoch
    is never set twice), then give one pass of the batches with their ids (``indices``: from the
    (batch) sampler, loading no data); ``settled()`` reads a restored pass. ``state(mechanism)`` saves
    and loads its data state as a checkpoint does. ``call`` says how its factory was called (the
    keywords it took of those offered; empty for a wrapped loader).
    """

    def __init__(
        self,
        outer: Any,
        module: ModuleType | None = None,
        *,
        recipe: LoaderRecipe | None = None,
        position: tuple[int, int] = (0, 1),
        hooks: LoaderHooks | None = None,
        call: FactoryCall | None = None,
    ) -> None:
        self.outer = outer
        self.loader = unwrap_loader(outer)
        self.module = module
        self.recipe = recipe
        self.rank, self.world_size = position
        self.hooks = hooks if hooks is not None else LoaderHooks.of(module)
        self.call = call if call is not None else FactoryCall()
        self.set_epochs = recipe.set_epoch if recipe is not None else True
        self.ids_from_data = recipe.ids_from_data if recipe is not None else False
        self._facts: LoaderFacts | None = None
        self._epoch: int | None = None  # the epoch last set

    @classmethod
    def wrap(
        cls,
        loader: Any,
        hooks: ModuleType | LoaderHooks | None = None,
        *,
        set_epoch: bool = True,
        ids_from_data: bool = False,
        position: tuple[int, int] | None = None,
    ) -> OpenedLoader:
        """A loader that exists already (a training script built it), with the hooks of ``hooks`` (a
        module or :class:`LoaderHooks`), at ``position`` (rank, world size; from the process group when
        None). It has no recipe, so it cannot be opened again."""
        found = hooks if isinstance(hooks, LoaderHooks) else LoaderHooks.of(hooks)
        module = hooks if isinstance(hooks, ModuleType) else None
        where = position if position is not None else group_position()
        opened = cls(loader, module, hooks=found, position=where)
        opened.set_epochs, opened.ids_from_data = set_epoch, ids_from_data
        return opened

    @property
    def facts(self) -> LoaderFacts:
        """What the loader says of itself (:func:`~ddpcheck.checker.facts.read_facts`), read once."""
        if self._facts is None:
            self._facts = read_facts(self.loader)
        return self._facts

    @property
    def collated(self) -> bool:
        return is_collated(self.loader)

    @property
    def workers(self) -> int:
        """The loader's DataLoader workers: its ``num_workers``, else its factory's default for them (a
        torchdata ``nodes`` pipeline keeps its workers inside); 0 when neither says."""
        count = getattr(self.loader, "num_workers", None)
        if count is None:
            count = self.call.default("num_workers")
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def place(self) -> dict[str, int]:
        """This rank's place by the names the loader file's hooks may take (rank, world size, data-parallel
        rank and world size), as its factory was offered them."""
        layout = self.recipe.layout if self.recipe is not None else None
        return rank_offer(layout_of(layout, self.world_size), self.rank)

    def set_epoch(self, epoch: int) -> None:
        """What the loop calls before ``epoch`` (the file's ``set_epoch`` hook, else the loader's or its
        parts'); nothing when the recipe turns set_epoch off."""
        self._epoch = epoch
        if self.set_epochs:
            loop_set_epoch(self.outer, epoch, self.hooks.set_epoch)

    def first_set_epoch(self) -> str:
        """Epoch 0's set_epoch, watched: the parts with a ``set_epoch`` it never reached ("" for none;
        "" too when set_epoch is off)."""
        self._epoch = 0
        return first_set_epoch(self.outer, self.hooks.set_epoch) if self.set_epochs else ""

    def _enter(self, epoch: int | None) -> None:
        if epoch is not None and epoch != self._epoch:
            self.set_epoch(epoch)

    def batches(self, epoch: int | None = None) -> IdBatches:
        """One pass of the real loader: ``(batch, ids, worker)``; ``.source`` says how ids were found.
        ``epoch`` None: the epoch is not set."""
        self._enter(epoch)
        by_index = not self.ids_from_data
        return IdBatches(self.outer, self.hooks.sample_ids, self.facts, self.loader, by_index=by_index)

    def indices(self, epoch: int | None = None) -> SamplerBatches:
        """One pass of the (batch) sampler: ``(ids, None)`` per batch, no data loaded."""
        self._enter(epoch)
        return SamplerBatches(self.loader)

    def settled(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        log: IndexLog | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[list[Hashable]]:
        """Every batch's ids of one pass of what a restored loop iterates: the loader, or ``iterable``
        (what a resume hook returned; ``log``: where the DataLoaders it iterates log, see
        :class:`~ddpcheck.checker.index_log.catch_all`), settled when the pass ends
        (:func:`~ddpcheck.checker.batches.settled_ids`). The epoch is not set."""
        source = self.outer if iterable is None else iterable
        where = log if log is not None else log_of(self.loader)
        hook, by_index = self.hooks.sample_ids, not self.ids_from_data
        return settled_ids(source, hook, self.facts, self.loader, where, by_index=by_index, on_batch=on_batch)

    def resume_mechanism(self) -> str:
        """Where the loader keeps a state to resume from ("" for nowhere)."""
        hooks = self.hooks
        return resume_mechanism(self.outer, hooks.resume, hooks.save, hooks.load)

    def state(self, mechanism: str, *, dcp: bool = False) -> LoaderState:
        """The loader's data state, kept where ``mechanism`` (:meth:`resume_mechanism`) says, saved and
        loaded as a checkpoint does (``dcp``: through ``torch.distributed.checkpoint``)."""
        return LoaderState(self.outer, self.hooks, self.place(), mechanism, dcp=dcp)

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The file's hook ``name`` (see :class:`~ddpcheck.checker.hooks.LoaderHooks`), or None."""
        value = getattr(self.hooks, name)
        return value if callable(value) else None


def open_loader(
    recipe: LoaderRecipe, rank: int | None = None, world_size: int | None = None, *, restarted: bool = False
) -> OpenedLoader:
    """Build ``recipe``'s loader in this rank (rank and world size from the process group when not
    given); ``restarted``: as a restarted process opens it, with fresh global RNG and the loader file's
    code run again. Nothing is iterated or set yet."""
    if rank is None or world_size is None:
        rank, world_size = group_position()
    if restarted:
        from ddpcheck.launch.rank import fresh_random_state

        fresh_random_state()
    outer, module, call = build(recipe, rank, world_size, fresh=restarted)
    return OpenedLoader(outer, module, recipe=recipe, position=(rank, world_size), call=call)
