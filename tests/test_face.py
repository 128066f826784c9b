"""The rank side's one face: a :class:`LoaderRecipe` made once from the options, and an
:class:`OpenedLoader` every rank-side run (recording, metric, training, a script's recorder) shares.

The recipe is what makes defect 1 of issue 27 impossible: the metric and training checks once rebuilt
the record options field by field and left ``--factory-arg`` out, so they judged another loader.
"""

from __future__ import annotations

import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddpcheck.checker.face import OpenedLoader, open_loader
from ddpcheck.checker.hooks import LoaderHooks
from ddpcheck.checker.loaderfile import BadLoaderFile, FactoryCall, LoaderSpec
from ddpcheck.checker.recipe import LoaderRecipe, RecordOptions, record_options
from ddpcheck.layout import Layout, parse_mesh
from ddpcheck.options import CheckOptions
from tests.conftest import FIXTURES

N = 24


class Squares(Dataset[tuple[int, int]]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, index * index


def _two_worker_loader(shuffle: bool = True) -> DataLoader[tuple[int, int]]:
    sampler: DistributedSampler[tuple[int, int]] = DistributedSampler(
        Squares(), num_replicas=2, rank=1, shuffle=shuffle, seed=3
    )
    return DataLoader(Squares(), batch_size=4, sampler=sampler, num_workers=2)


# --------------------------------------------------------------------------- the recipe


def test_a_recipe_from_the_options_carries_every_loader_option() -> None:
    options = CheckOptions(
        factory="build", factory_args=(("split", "contiguous"),), patch=True, batch_size=3, set_epoch=False
    )
    spec = LoaderSpec("loader.py", "build")
    mesh = parse_mesh("dp=2,tp=2")
    recipe = LoaderRecipe.from_options(spec, options, mesh)
    assert recipe.spec == spec and recipe.factory == "build"
    assert recipe.factory_args == (("split", "contiguous"),)
    assert recipe.patch and recipe.batch_size == 3 and not recipe.set_epoch and recipe.layout == mesh
    # every field the recipe shares with the run's options comes from them, by name
    shared = {f.name for f in fields(LoaderRecipe)} & {f.name for f in fields(CheckOptions)}
    assert shared == {"factory_args", "patch", "set_epoch", "batch_size", "ids_from_data"}
    assert all(getattr(recipe, name) == getattr(options, name) for name in shared)
    # a data run's record options hold that recipe, and take their other fields by name too
    record = record_options(spec, options, mesh, digest=True)
    assert record.recipe == recipe and record.digest
    own = {f.name for f in fields(RecordOptions)} - {"recipe", "digest"}
    assert own and all(getattr(record, name) == getattr(options, name) for name in own)
    assert record_options(spec, CheckOptions(epochs=5, work=False)).epochs == 5


def test_the_metric_and_training_checks_open_the_data_runs_recipe_factory_args_included() -> None:
    """Defect 1 made impossible: both scenarios hold the recipe made from the options, and their rank
    entry points take nothing else to build a loader from."""
    import inspect

    from ddpcheck.scenarios.metric import MetricEquivalence, evaluate_rank
    from ddpcheck.scenarios.training import TrainingEquivalence, train_rank, train_reference_rank

    options = CheckOptions(factory_args=(("split", "contiguous"),), simulate=True)
    spec = LoaderSpec(str(FIXTURES / "train_factory_arg.py"))
    metric = MetricEquivalence(spec, options)
    training = TrainingEquivalence(spec, options)
    assert metric.recipe.factory_args == (("split", "contiguous"),)
    assert training.options.recipe.factory_args == (("split", "contiguous"),)
    assert metric.recipe == training.options.recipe == LoaderRecipe.from_options(spec, options)
    assert list(inspect.signature(evaluate_rank).parameters) == ["recipe"]
    assert list(inspect.signature(train_rank).parameters) == ["options"]
    assert "spec" not in inspect.signature(train_reference_rank).parameters


def test_the_recipe_evolves_without_losing_a_field() -> None:
    recipe = LoaderRecipe(LoaderSpec("x.py"), factory_args=(("a", 1),), patch=True, num_workers=2)
    moved = recipe.evolve(layout=Layout.plain(2), batch_size=8)
    assert moved.factory_args == (("a", 1),) and moved.patch and moved.num_workers == 2
    assert moved.arguments() == (("a", 1), ("num_workers", 2))
    assert LoaderRecipe(LoaderSpec("x.py"), factory_args=(("a", 1),)).arguments() == (("a", 1),)


# --------------------------------------------------------------------------- opening a loader file

LOADER = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BUILT = []
STARTED = torch.rand(1).item()  # the global RNG when the file's code ran


def make_loader(rank, world_size, split, num_workers=0, batch_size=4):
    BUILT.append((split, num_workers))
    data = TensorDataset(torch.arange(24))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=1)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, num_workers=num_workers)


def sample_ids(batch):
    return [int(x) * 10 for x in batch[0]]
"""


@pytest.fixture
def loader_file(tmp_path: Path) -> Path:
    path = tmp_path / "face_loader.py"
    path.write_text(textwrap.dedent(LOADER))
    return path


def test_open_loader_passes_factory_args_and_workers_and_refuses_without_them(loader_file: Path) -> None:
    recipe = LoaderRecipe(LoaderSpec(str(loader_file)), factory_args=(("split", "strided"),), num_workers=2)
    opened = open_loader(recipe, 0, 2)
    assert opened.module is not None and opened.module.BUILT[-1] == ("strided", 2)
    assert (opened.rank, opened.world_size) == (0, 2) and opened.facts.num_workers == 2
    assert opened.hooks.sample_ids is not None and opened.hook("sample_ids") is opened.hooks.sample_ids
    with pytest.raises(BadLoaderFile, match="required parameter 'split'"):
        open_loader(LoaderRecipe(LoaderSpec(str(loader_file))), 0, 2)


def test_a_restarted_open_runs_the_file_again_with_fresh_global_rng(loader_file: Path) -> None:
    recipe = LoaderRecipe(LoaderSpec(str(loader_file)), factory_args=(("split", "strided"),), num_workers=2)
    opened = open_loader(recipe, 1, 2)
    first = [ids for _, ids, _ in opened.batches(0)]
    torch.rand(5)  # the parent's RNG moved on: a restart must not see that
    again = open_loader(recipe, 1, 2, restarted=True)
    assert again.module is not opened.module and again.recipe == recipe
    assert [ids for _, ids, _ in again.batches(0)] == first
    assert again.module is not None and opened.module is not None
    # reseeded from entropy, as a started process is: the file's code draws anew at each restart
    third = open_loader(recipe, 1, 2, restarted=True)
    assert again.module.STARTED != third.module.STARTED  # type: ignore[union-attr]
    assert open_loader(recipe, 1, 2).module is third.module  # not restarted: the module is reused


def test_the_sample_ids_hook_names_the_samples(loader_file: Path) -> None:
    recipe = LoaderRecipe(LoaderSpec(str(loader_file)), factory_args=(("split", "strided"),))
    opened = open_loader(recipe, 0, 1)
    batches = opened.batches(0)
    seen = [ids for _, ids, _ in batches]
    assert sorted(int(i) for ids in seen for i in ids) == [10 * i for i in range(24)]  # type: ignore[call-overload]
    assert batches.source == "hook"


# --------------------------------------------------------------------------- a DataLoader that exists


def test_a_wrapped_two_worker_loader_gives_its_batches_with_ids_and_workers() -> None:
    loader = _two_worker_loader()
    opened = OpenedLoader.wrap(loader, position=(1, 2))
    facts = opened.facts
    assert facts.num_workers == 2 and facts.dataset_kind == "map" and facts.sampler == "DistributedSampler"
    assert facts.batch_size == 4 and facts.has_set_epoch
    loader.sampler.set_epoch(0)  # type: ignore[attr-defined]
    expected = list(loader.sampler)
    batches = opened.batches(0)
    got = list(batches)
    assert [i for _, ids, _ in got for i in ids] == expected
    assert [worker for _, _, worker in got] == [0, 1, 0]  # round robin over the two workers
    assert all(list(batch[0]) == ids for batch, ids, _ in got)  # the ids are the batch's own indices
    assert batches.source == "index"
    assert [list(ids) for ids, _ in opened.indices(0)] == [ids for _, ids, _ in got]


def test_set_epoch_follows_the_policy_and_is_never_called_twice_for_one_epoch() -> None:
    loader = _two_worker_loader()
    calls: list[int] = []
    original = loader.sampler.set_epoch  # type: ignore[attr-defined]

    def spy(epoch: int) -> None:
        calls.append(epoch)
        original(epoch)

    loader.sampler.set_epoch = spy  # type: ignore[attr-defined,method-assign]
    opened = OpenedLoader.wrap(loader, position=(1, 2))
    epoch0 = [ids for _, ids, _ in opened.batches(0)]
    opened.set_epoch(1)
    epoch1 = [ids for _, ids, _ in opened.batches(1)]
    assert calls == [0, 1] and epoch0 != epoch1
    quiet = OpenedLoader.wrap(_two_worker_loader(), set_epoch=False, position=(1, 2))
    assert [ids for _, ids, _ in quiet.batches(0)] == [ids for _, ids, _ in quiet.batches(1)]
    assert quiet.first_set_epoch() == ""


def test_a_wrapped_loader_takes_hooks() -> None:
    hooks = LoaderHooks(sample_ids=lambda batch: [f"s{int(i)}" for i in batch[0]])
    opened = OpenedLoader.wrap(_two_worker_loader(shuffle=False), hooks, position=(1, 2))
    batches = opened.batches(0)
    assert next(ids for _, ids, _ in batches) == ["s1", "s3", "s5", "s7"]
    assert batches.source == "hook" and opened.recipe is None and opened.module is None
    assert opened.call.took == frozenset() and opened.workers == 2  # no factory: the loader's own count


def test_ids_from_data_identifies_samples_by_their_batches() -> None:
    opened = OpenedLoader.wrap(_two_worker_loader(shuffle=False), ids_from_data=True, position=(1, 2))
    batches = opened.batches(0)
    list(batches)
    assert batches.source != "index"


# --------------------------------------------------------------------------- what resume asks of the face

FACTORIES = """
class Own:
    def __iter__(self):
        return iter([[1, 2], [3, 4]])


def make_own(rank, num_workers=3):
    return Own()


def make_closed(num_workers=1, /, rank=0):
    return Own()
"""


def test_the_opened_loader_knows_how_its_factory_was_called(loader_file: Path, tmp_path: Path) -> None:
    recipe = LoaderRecipe(LoaderSpec(str(loader_file)), factory_args=(("split", "strided"),), batch_size=3)
    opened = open_loader(recipe, 0, 2)
    assert opened.call.took == {"rank", "world_size", "split", "batch_size"}  # dp_rank: not taken
    assert opened.call.takes("num_workers") and not opened.call.takes("seed")
    assert opened.workers == 0 and opened.facts.batch_size == 3
    assert opened.place() == {"rank": 0, "world_size": 2, "dp_rank": 0, "dp_world_size": 2}
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    own = open_loader(LoaderRecipe(LoaderSpec(str(path), "make_own")), 1, 2)
    assert own.workers == 3 and own.call.took == {"rank"}  # no DataLoader: the factory's default count

    def open_ended(rank: int, **kwargs: object) -> None: ...

    call = FactoryCall.of(open_ended, {"rank": 0, "batch_size": 4})
    assert call.took == {"rank", "batch_size"} and call.takes("num_workers")  # **kwargs takes any keyword
    closed = open_loader(LoaderRecipe(LoaderSpec(str(path), "make_closed")), 0, 1)
    assert not closed.call.takes("num_workers") and closed.workers == 1  # positional-only: never by name


def test_a_restored_pass_is_read_through_the_subset_to_its_samples() -> None:
    """A restored StatefulDataLoader over a Subset: the ids settled after the pass are the samples the
    Subset names, as the uninterrupted pass reads them (positions would be another stream)."""
    from torch.utils.data import Subset, TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    def build() -> StatefulDataLoader:
        data = Subset(TensorDataset(torch.arange(200)), list(range(100, 200)))
        sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=0)
        return StatefulDataLoader(data, batch_size=4, sampler=sampler)

    first = OpenedLoader.wrap(build(), position=(1, 2))
    whole = [ids for _, ids, _ in first.batches(0)]
    assert all(100 <= int(i) < 200 for ids in whole for i in ids)  # type: ignore[call-overload]
    stopped = OpenedLoader.wrap(build(), position=(1, 2))
    state = stopped.state("loader")
    saved: list[object] = []
    stopped.set_epoch(0)
    stopped.settled(on_batch=lambda count: saved.append(state.save()) if count == 5 else None)
    restored = OpenedLoader.wrap(build(), position=(1, 2))
    assert restored.state("loader").load((None, saved[0])) == ""  # rank 1 loads old rank 1's state
    restored.set_epoch(0)
    rest = restored.settled()
    assert [list(ids) for ids in rest] == [list(ids) for ids in whole[5:]]


SAVING_HOOKS = """
import torch
from torch.utils.data import DataLoader, TensorDataset

SEEN = []


def make_loader(rank, world_size):
    return DataLoader(TensorDataset(torch.arange(8)), batch_size=2)


def save_state(loader, rank, dp_world_size):
    return {"rank": rank, "of": dp_world_size}


def load_state(loader, states, rank):
    SEEN.append((rank, states))
"""


def test_the_state_is_saved_and_loaded_through_the_files_hooks(tmp_path: Path) -> None:
    path = tmp_path / "hooks_loader.py"
    path.write_text(SAVING_HOOKS)
    opened = open_loader(LoaderRecipe(LoaderSpec(str(path))), 1, 2)
    assert opened.resume_mechanism() == "hooks"
    state = opened.state("hooks")
    saved = state.save()
    assert isinstance(saved, bytes)
    assert state.load((None, saved)) == ""
    assert opened.module is not None and opened.module.SEEN == [(1, [None, {"rank": 1, "of": 2}])]
