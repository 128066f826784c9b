"""The one per-batch id step (``BatchIds``) that pulling (``IdBatches``, loader files) and pushing (a
training script's recorder) share, and the one endless-epoch guard both use."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from ddpcheck.checker.batches import MIXED_IDS, BatchIds, IdBatches
from ddpcheck.checker.facts import read_facts
from ddpcheck.checker.loaderfile import BadLoaderFile
from ddpcheck.checker.running import ENDLESS_FACTOR, ENDLESS_PROBE, EndlessGuard
from ddpcheck.checker.subsets import base_indices
from ddpcheck.trace import IdBuffer


def _batch(ids: list[int]) -> dict[str, torch.Tensor]:
    return {"id": torch.tensor(ids), "x": torch.zeros(len(ids))}


def test_dispatched_indices_name_the_samples_through_a_subset() -> None:
    base = base_indices(Subset(list(range(10)), [9, 7, 5]))
    step = BatchIds(None, True, base)
    assert step.ids_of(_batch([100, 101]), [0, 2]) == [9, 5]
    assert (step.found, step.indexed, step.by_data) == ("index", True, False)


def test_data_after_an_index_is_mixed_and_stays_so() -> None:
    step = BatchIds(None, True)
    step.ids_of(_batch([0, 1]), [0, 1])
    assert step.ids_of(_batch([2, 3]), None) == [2, 3]  # the "id" field
    assert (step.found, step.by_data) == (MIXED_IDS, True)
    step.ids_of(_batch([4, 5]), [4, 5])  # an index again: the source said stays
    assert step.found == MIXED_IDS


def test_an_index_in_an_earlier_pass_makes_this_pass_mixed() -> None:
    assert BatchIds(None, True).ids_of(_batch([0]), None) == [0]
    fresh, carried = BatchIds(None, True), BatchIds(None, True, indexed=True)
    fresh.ids_of(_batch([0]), None)
    carried.ids_of(_batch([0]), None)
    assert (fresh.found, carried.found) == ("field:id", MIXED_IDS)


def test_the_hook_identifies_batches_without_dispatched_indices() -> None:
    step = BatchIds(lambda batch: [int(i) * 10 for i in batch["id"]], True)
    assert step.ids_of(_batch([1, 2]), None) == [10, 20]
    assert step.found == "hook"


def test_id_batches_take_the_dispatched_indices_of_a_real_loader_with_workers() -> None:
    data = Subset([{"id": i} for i in range(40)], list(range(39, -1, -1)))
    loader = DataLoader(data, batch_size=4, num_workers=2, shuffle=True)
    batches = IdBatches(loader, None, read_facts(loader), loader)
    got = [(ids, [int(i) for i in batch["id"]]) for batch, ids, _ in batches]
    assert all(ids == seen for ids, seen in got)  # the indices name exactly the samples the batch holds
    assert sorted(i for ids, _ in got for i in ids) == list(range(40))
    assert batches.source == "index"


def test_the_script_guard_is_the_more_permissive_one() -> None:
    """No probe of distinct ids for scripts: an epoch that repeats its few samples is left to the
    length rule; loader files probe them."""
    ids = IdBuffer()
    ids.extend([i % 10 for i in range(ENDLESS_PROBE)])
    script = EndlessGuard(None, False, subject="the loader built at train.py:3", probe_distinct=False)
    assert script.due > len(ids)
    script.check(ids)
    with pytest.raises(BadLoaderFile, match=r"the loader looks endless: .* but only 10 distinct"):
        EndlessGuard(None, False).check(ids)
    long = IdBuffer()
    long.extend(list(range(ENDLESS_FACTOR * 10 + ENDLESS_PROBE + 1)))
    with pytest.raises(BadLoaderFile, match=r"^the loader built at train.py:3 looks endless: .* --steps N$"):
        EndlessGuard(10, False, subject="the loader built at train.py:3", probe_distinct=False).check(long)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_opened_under_catch_all_logs_there_even_when_its_loader_has_a_log(workers: int) -> None:
    """A resume hook's ``islice(loader, step)`` is read through ``catch_all``. Under the script watchers
    every loader carries a log of its own from its constructor; that log must not take the batches away
    from ``catch_all`` (the CI failure: restores said "cannot tell which indices" after an in-process
    recording had installed the watchers in the process the ranks were forked from)."""
    from itertools import islice

    from ddpcheck.checker.index_log import catch_all, log_of

    loader = DataLoader(list(range(12)), batch_size=3, num_workers=workers)
    own = log_of(loader)
    with catch_all() as caught:
        skipped = islice(loader, 2, None)
        got = [batch.tolist() for batch in skipped]
    assert got == [[6, 7, 8], [9, 10, 11]]
    assert [ids for ids, _ in caught.ready] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert list(caught.ready) == list(own.ready)  # the loader's own log keeps its entries too
    plain = DataLoader(list(range(4)), batch_size=2)
    with catch_all() as caught:
        assert [b.tolist() for b in plain] == [[0, 1], [2, 3]]
    assert [ids for ids, _ in caught.ready] == [[0, 1], [2, 3]] and caught.iterators == 1
