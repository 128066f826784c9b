"""The script recorder in one process (no launch): which iterations of a real DataLoader are epochs.

A peek (an iterator the script leaves after a batch or two at one line, while the loader is iterated
further at another: the DDP tutorial's ``len(next(iter(loader))[0])``) is no epoch; a loop that leaves
every epoch early at one line is an epoch each time (the neighbour the peek rule must not catch).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from torch.utils.data import DataLoader, DistributedSampler, Subset, random_split

from ddpcheck.checker.script import LoaderRecord, ScriptRecorder, ScriptRecordOptions, StopScript
from ddpcheck.checker.watch import watching

SIZE = 32


def _loader() -> DataLoader:
    data = list(range(SIZE))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    return DataLoader(data, batch_size=4, sampler=sampler)


def _record(train: Callable[[DataLoader], None], epochs: int = 2) -> ScriptRecorder:
    recorder = ScriptRecorder(ScriptRecordOptions(epochs=epochs, model_steps=2))
    with watching(recorder):
        loader = _loader()
        try:
            train(loader)
        except StopScript:
            pass
        recorder.finish()
    return recorder


def _line(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def _only(recorder: ScriptRecorder) -> LoaderRecord:
    (record,) = recorder.loaders.values()
    return record


def _orders(record: LoaderRecord) -> list[list[int]]:
    return [list(e.ids) for e in record.epochs]


def _sampler_orders(epochs: int) -> list[list[int]]:
    sampler = _loader().sampler
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        orders.append(list(sampler))
    return orders


def test_a_peek_before_set_epoch_is_no_epoch_and_is_noted() -> None:
    def train(loader: DataLoader) -> None:
        for epoch in range(5):
            next(iter(loader))  # the peek: the previous epoch's order
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for _ in loader:  # the loop
                pass

    recorder = _record(train)
    record = _only(recorder)
    assert _orders(record) == _sampler_orders(2)  # the loop's epochs 0 and 1, whole, and nothing else
    assert [e.epoch for e in record.epochs] == [0, 1]
    (note,) = recorder.notes
    found = re.search(
        r"a one-batch peek at \S*test_script_recorder.py:(\d+) is not counted as an epoch", note
    )
    loop = re.search(r"the loop at \S*test_script_recorder.py:(\d+)", note)
    assert note.startswith(f"loader {record.name}: ") and found and loop, note
    assert (int(found[1]), int(loop[1])) == (_line("# the peek:"), _line("for _ in loader:  # the loop"))


def test_a_loop_that_leaves_every_epoch_after_one_batch_counts_each_epoch() -> None:
    def train(loader: DataLoader) -> None:
        for epoch in range(5):
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for _ in loader:
                break  # the same line every epoch: each iteration is an epoch (its rest is drained)

    recorder = _record(train)
    assert _orders(_only(recorder)) == _sampler_orders(2)
    assert not recorder.notes


def test_short_iterations_at_two_lines_are_all_epochs_when_none_goes_further() -> None:
    """A peek rule needs an iteration that goes further: two lines that both leave after one batch are
    both epochs (in the order the script made them), as before the rule."""

    def train(loader: DataLoader) -> None:
        for epoch in range(5):
            next(iter(loader))
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for _ in loader:
                break

    recorder = _record(train, epochs=3)
    orders = _sampler_orders(2)
    # peek 0 (order 0), loop 0 (order 0), peek 1 (order 0: before set_epoch(1)); then the stop
    assert _orders(_only(recorder)) == [orders[0], orders[0], orders[0]]
    assert not recorder.notes


def test_a_later_peek_at_a_line_known_to_peek_is_left_undrained() -> None:
    peeked: list[int] = []

    def train(loader: DataLoader) -> None:
        for epoch in range(5):
            peeked.append(int(next(iter(loader))[0]))
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            for _ in loader:
                pass

    record = _only(_record(train, epochs=3))
    assert len(record.epochs) == 3 and len(peeked) == 3  # the fourth peek is where the script stops
    assert all(len(e.ids) == SIZE for e in record.epochs)


def test_a_subset_carries_the_call_that_drew_it_as_written() -> None:
    """``LoaderFacts.subset_call``: the user's random_split or Subset call at its line, for the cause."""
    recorder = ScriptRecorder(ScriptRecordOptions(epochs=1, model_steps=None))
    with watching(recorder):
        data = list(range(SIZE))
        train, _ = random_split(data, [0.75, 0.25])  # unseeded, as minGPT's
        for _ in DataLoader(train, batch_size=8):
            pass
        for _ in DataLoader(Subset(data, range(0, SIZE, 2)), batch_size=8):
            pass
        for _ in DataLoader(data, batch_size=8):
            pass
        recorder.finish()
    calls = [record.facts.subset_call if record.facts else None for record in recorder.loaders.values()]
    here = Path(__file__).name
    assert calls[0] is not None and calls[0].endswith(f"{here}:{_line('= random_split(data')}")
    assert calls[0].startswith("random_split(data, [0.75, 0.25]) at ")
    assert calls[1] is not None and calls[1].startswith("Subset(data, range(0, SIZE, 2)) at ")
    assert calls[2] == ""  # no subset: nothing to name
