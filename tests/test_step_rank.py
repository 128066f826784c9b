"""The step watcher's rank side (issue 35), in this process: windows, kept gradients, draws, the replay's
union of batches and draws. The launches of real ranks are in ``test_step_launch.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from ddpcheck.checker import replay as rp
from ddpcheck.checker import rng
from ddpcheck.checker.draws import NotReplayable
from ddpcheck.checker.grads import GradKeeper, Unreadable, box_positions, local_part
from ddpcheck.checker.step import (
    StepOptions,
    StepWatcher,
    batch_samples,
    install_watcher,
    supervised,
    uninstall,
)


@pytest.fixture
def watch(tmp_path: Any) -> Iterator[Any]:
    """Start a watcher in this process; every patch is undone afterwards."""
    made: list[StepWatcher] = []

    def start(**options: Any) -> StepWatcher:
        watcher = install_watcher(StepOptions(**options))
        made.append(watcher)
        return watcher

    try:
        yield start
    finally:
        uninstall()


def _batch(rows: list[list[int]], pad: int = 0, side: str = "right") -> dict[str, torch.Tensor]:
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    labels = torch.full((len(rows), longest), -100)
    for i, row in enumerate(rows):
        where = slice(0, len(row)) if side == "right" else slice(longest - len(row), longest)
        ids[i, where] = torch.tensor(row)
        mask[i, where] = 1
        labels[i, where] = torch.tensor(row)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# --- the union of the ranks' batches ------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_union_pads_to_the_longest_on_the_batches_side(side: str) -> None:
    a = _batch([[5, 6, 7], [8]], pad=3, side=side)
    b = _batch([[1, 2, 4, 9, 9], [2, 2]], pad=3, side=side)
    merged = rp.from_plain(rp.union([rp.to_plain(a), rp.to_plain(b)]), a)
    assert merged["input_ids"].shape == (4, 5)
    expected = _batch([[5, 6, 7], [8], [1, 2, 4, 9, 9], [2, 2]], pad=3, side=side)
    for key in expected:
        assert torch.equal(merged[key], expected[key]), key


def test_union_refuses_padding_it_cannot_know() -> None:
    full_a = _batch([[5, 6, 7], [8, 8, 8]])  # no padded row: neither side nor pad value to learn
    full_b = _batch([[1, 2], [3, 4]])
    with pytest.raises(NotReplayable, match="no padded row"):
        rp.union([rp.to_plain(full_a), rp.to_plain(full_b)])
    odd = _batch([[5, 6, 7], [8]], pad=0)
    odd["input_ids"][1, 1] = 4  # two different values where the mask is 0: the pad id is not known
    with pytest.raises(NotReplayable, match="padding value is not known"):
        rp.union([rp.to_plain(odd), rp.to_plain(_batch([[1, 2, 3, 4], [1]]))])
    other = _batch([[5, 6, 7], [8]])
    other["position_ids"] = torch.arange(3).repeat(2, 1)  # no value where the mask is 0 repeats alone
    other["position_ids"][1, 1:] = torch.tensor([7, 9])
    longer = _batch([[1, 2, 3, 4], [1]])
    longer["position_ids"] = torch.arange(4).repeat(2, 1)
    with pytest.raises(NotReplayable, match="'position_ids'"):
        rp.union([rp.to_plain(other), rp.to_plain(longer)])


def test_union_without_a_mask_pads_where_the_labels_say() -> None:
    a = {"inputs": torch.tensor([[5, 6, 0], [7, 8, 9]]), "labels": torch.tensor([[6, 3, -100], [8, 9, 4]])}
    b = {"inputs": torch.tensor([[1, 2, 3, 4]]), "labels": torch.tensor([[2, 3, 4, 5]])}
    merged = rp.from_plain(rp.union([rp.to_plain(a), rp.to_plain(b)]), a)
    assert merged["inputs"].tolist() == [[5, 6, 0, 0], [7, 8, 9, 0], [1, 2, 3, 4]]  # the collate's own 0
    assert merged["labels"].tolist() == [[6, 3, -100, -100], [8, 9, 4, -100], [2, 3, 4, 5]]
    # a real token under an ignored label (an end-of-sequence 2) beside the padding 0: not known, n/a
    eos = {
        "inputs": torch.tensor([[5, 2, 0], [7, 8, 2]]),
        "labels": torch.tensor([[6, -100, -100], [8, 9, -100]]),
    }
    with pytest.raises(NotReplayable, match="padding value is not known"):
        rp.union([rp.to_plain(eos), rp.to_plain(b)])


def test_union_of_tuples_lists_and_batch_encodings() -> None:
    from transformers import BatchEncoding

    x0, x1 = torch.randn(2, 3), torch.randn(3, 3)
    y0, y1 = torch.tensor([0, 1]), torch.tensor([1, 1, 0])
    merged = rp.from_plain(rp.union([rp.to_plain((x0, y0)), rp.to_plain((x1, y1))]), (x0, y0))
    assert isinstance(merged, tuple) and torch.equal(merged[0], torch.cat([x0, x1]))
    assert torch.equal(merged[1], torch.cat([y0, y1]))
    columns = rp.union([rp.to_plain([x0, y0]), rp.to_plain([x1, y1])])  # default_collate's list of columns
    assert torch.equal(columns[0], torch.cat([x0, x1]))
    texts = rp.union([rp.to_plain(["a", "b"]), rp.to_plain(["c"])])  # a list of samples
    assert texts == ["a", "b", "c"]
    encoded = BatchEncoding(_batch([[4, 5], [6]]))
    back = rp.from_plain(rp.union([rp.to_plain(encoded), rp.to_plain(encoded)]), encoded)
    assert isinstance(back, BatchEncoding) and back["input_ids"].shape == (4, 2)
    with pytest.raises(NotReplayable, match="differs across ranks"):
        rp.union([rp.to_plain({"step": 3}), rp.to_plain({"step": 4})])
    arrays = rp.from_plain(rp.union([rp.to_plain(np.ones((2, 2))), rp.to_plain(np.zeros((1, 2)))]))
    assert isinstance(arrays, np.ndarray) and arrays.shape == (3, 2)


def test_union_of_draws() -> None:
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    assert torch.equal(rp.union_draw("torch.randn", [a, b], torch.empty(5, 4)), torch.cat([a, b]))
    same = torch.randn(1)
    assert torch.equal(rp.union_draw("torch.rand", [same, same.clone()], torch.empty(1)), same)
    perm = rp.union_draw("torch.randperm", [torch.tensor([1, 0]), torch.tensor([2, 0, 1])], torch.empty(5))
    assert sorted(perm.tolist()) == [0, 1, 2, 3, 4]
    assert rp.union_draw("random.random", [0.5, 0.5], 0.1) == 0.5
    with pytest.raises(NotReplayable, match="different values"):
        rp.union_draw("random.random", [0.5, 0.25], 0.1)
    with pytest.raises(NotReplayable, match="the replay draws"):
        rp.union_draw("torch.randn", [torch.randn(2, 3, 4), torch.randn(2, 5, 4)], torch.empty(4, 5, 4))


def test_batch_counts() -> None:
    batch = _batch([[1, 2, 3], [4]])
    assert batch_samples(batch) == 2 and supervised(batch) == 4
    assert supervised(batch, ignore_index=4) == 5  # 1, 2, 3 and the two -100s
    assert batch_samples((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert supervised((torch.zeros(5, 2),)) is None
    assert batch_samples([{"a": 1}, {"a": 2}, {"a": 3}]) == 3
    empty = _batch([[1], [2]])
    empty["labels"][:] = -100
    assert supervised(empty) == 0


# --- gradients --------------------------------------------------------------------------------------------


def test_kept_gradient_is_an_even_sample_with_the_full_norm() -> None:
    params = [nn.Parameter(torch.zeros(10, 10)), nn.Parameter(torch.zeros(37)), nn.Parameter(torch.zeros(3))]
    for p in params[:2]:
        p.grad = torch.randn_like(p)
    keeper = GradKeeper(limit=16)
    kept = keeper.keep(params)
    flat = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in params])
    picked = (torch.arange(16) * (flat.numel() - 1)) // 15
    assert len(kept.values) == 16 and kept.parameters == 140
    assert torch.allclose(torch.tensor(list(kept.values)), flat[picked])
    assert abs(kept.norm - float(flat.norm())) < 1e-5
    assert list(GradKeeper(limit=16).keep(params).values) == list(kept.values)  # the same positions again
    assert len(GradKeeper().keep(params).values) == 140  # small models: every coordinate


def test_a_shard_is_read_at_the_whole_tensors_positions() -> None:
    """A DTensor's shard is a box of the whole tensor: each wanted flat position of the whole is found in
    the box (its flat index there) or not (-1); a subclass that is no DTensor is named, never read."""
    whole = torch.arange(5 * 6 * 4).reshape(5, 6, 4)
    offsets, size = (1, 2, 0), (3, 4, 4)
    box = whole[1:4, 2:6, 0:4].reshape(-1)
    wanted = torch.tensor([0, 7, 32, 33, 57, 80, 119, 70])
    index = box_positions(tuple(whole.shape), offsets, size, wanted)
    inside = index >= 0
    assert torch.equal(box[index[inside]], wanted[inside])
    coords = np.stack(np.unravel_index(wanted.numpy(), whole.shape), axis=1)
    expected = [all(o <= c < o + n for c, o, n in zip(row, offsets, size, strict=True)) for row in coords]
    assert inside.tolist() == expected and any(expected) and not all(expected)
    plain = nn.Parameter(torch.ones(3))
    assert local_part(plain) == (plain, None)

    class Wrapped(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    with pytest.raises(Unreadable, match="Wrapped"):
        local_part(torch.Tensor._make_subclass(Wrapped, torch.ones(2)))


# --- the watcher, in this process -----------------------------------------------------------------------


class Tower(nn.Module):
    def __init__(self, noisy: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(8, 2)
        self.noisy = noisy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.a(x)))
        if self.noisy:
            h = F.rrelu(h, training=True)  # samples in C++: no wrapper sees it
        return self.b(h)


def _train(watcher: StepWatcher, model: nn.Module, batches: int, accumulate: int = 2) -> list[Any]:
    """A plain loop; returns, per optimizer step, the gradient just before clipping."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before_clip = []
    for i in range(batches):
        batch = {"x": torch.ones(3, 4), "labels": torch.tensor([0, 1, -100])}
        batch = watcher.handed("loop.py:1", 0, i, batch)
        loss = F.cross_entropy(model(batch["x"] + 0.1 * torch.randn(3, 4)), batch["labels"])
        loss.backward()
        assert watcher.window_open()
        if (i + 1) % accumulate == 0:
            before_clip.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            optimizer.step()
            optimizer.zero_grad()
            assert not watcher.window_open()
    return before_clip


def test_windows_micro_steps_and_kept_gradient(watch: Any, tmp_path: Any) -> None:
    watcher = watch(out=str(tmp_path), compare_batches=2)
    torch.manual_seed(0)
    grads = _train(watcher, Tower(), batches=5)
    trace = watcher.finish()
    assert [len(s.micro) for s in trace.steps] == [2, 2] and len(trace.open_micro) == 1
    first = trace.steps[0]
    assert [m.batches for m in first.micro] == [(0,), (1,)]
    assert first.micro[0].samples == 3 and first.micro[0].supervised == 2
    assert first.micro[0].forwards == (("a", 1), ("b", 1))
    assert [d.call for d in first.micro[0].draws] == ["torch.randn"]
    assert first.micro[0].draws[0].site.endswith("test_step_rank.py:" + str(_line("0.1 * torch.randn")))
    assert torch.equal(torch.tensor(list(first.grad or ())), grads[0])  # before clipping
    assert first.not_comparable == "" and trace.dropout_off
    second = trace.steps[1]  # starts at batch 2: outside --compare-batches 2, only counted
    assert second.grad is None and second.micro[0].forwards == () and second.micro[0].draws == ()
    saved = sorted(os.listdir(tmp_path / "step" / "rank0"))
    assert saved == ["loop.py_1-e0-b0.pt"] and os.listdir(tmp_path / "step" / "params") == saved


def _line(text: str) -> int:
    with open(__file__) as handle:
        return next(i for i, line in enumerate(handle, 1) if text in line and "_line(" not in line)


def test_dropout_is_off_only_in_compared_windows(watch: Any) -> None:
    watcher = watch(compare_batches=1)
    model = Tower()
    x = torch.ones(64, 4)
    watcher.handed("l", 0, 0, x)  # window 0 is compared: dropout off
    assert torch.equal(model(x), model(x))
    model(x).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.0).step()
    watcher.handed("l", 0, 1, x)  # window 1 is not: dropout as the script asked
    assert not torch.equal(model(x), model(x))


def test_unreplayed_random_consumption_is_named(watch: Any) -> None:
    watcher = watch()
    torch.manual_seed(0)
    _train(watcher, Tower(noisy=True), batches=2)
    reason = watcher.finish().steps[0].not_comparable
    assert "torch's random stream was consumed before the backward" in reason


def test_loading_draws_are_the_loaders_and_fetches_say_what_they_consumed(watch: Any) -> None:
    class Noisy(Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.rand(4) + float(np.random.rand())  # drawn while loading, in this process

    watcher = watch()
    model = Tower()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Noisy(), batch_size=2)
    for position, batch in enumerate(loader):
        batch = watcher.handed("loader", 0, position, batch)
        model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    fetches = watcher.fetch_draws(loader)
    trace = watcher.finish()
    assert fetches is not None and [f.batch for f in fetches] == [0, 1, 2]
    assert all(f.worker is None and {d.stream for d in f.draws} == {"torch", "numpy"} for f in fetches)
    assert len({f.draws[0].state for f in fetches}) == 3  # each fetch starts where the last one left
    assert all(not m.draws for s in trace.steps for m in s.micro)  # no loop draw
    assert all(s.not_comparable == "" for s in trace.steps)  # the fetches' consumption is explained


def test_uninstall_gives_torch_back(watch: Any) -> None:
    def now() -> tuple[Any, ...]:
        return (torch.randn, torch.Tensor.normal_, torch.autograd.backward, F.dropout, np.random.rand)

    originals = now()
    watch()
    assert torch.randn is not originals[0]
    uninstall()
    assert now() == originals
    assert "normal_" not in torch.Tensor.__dict__


class StochasticDepth(nn.Module):
    """Draws inside its forward (not a loop draw, but the replay must give it the ranks' values)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.rand(len(x), 1)
        self.kept.append(keep)
        return self.lin(x) * keep


def _ranked_run(rank: int, world: int, options: dict[str, Any], monkeypatch: Any) -> tuple[Any, Any, Any]:
    """One 'rank' of a launch in this process (no process group: the watcher reads RANK/WORLD_SIZE)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    watcher = install_watcher(StepOptions(**options))
    np.random.seed(rank)
    torch.manual_seed(rank)
    model = StochasticDepth()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    received, drawn = [], []
    for position in range(2):
        rows = 2 + rank if world > 1 else 5  # the replay's own batch is replaced by the ranks' 2 + 3 rows
        batch = {"x": torch.full((rows, 4), float(rank + 10 * position))}
        batch = watcher.handed("l", 0, position, batch)
        received.append(batch["x"][:, 0].tolist())
        drawn.append(np.random.rand(len(batch["x"])))  # a loop draw of numpy's
        model(batch["x"] + torch.tensor(drawn[-1], dtype=torch.float32)[:, None]).sum().backward()
    optimizer.step()
    trace = watcher.finish()
    uninstall()
    return trace, (received, drawn), torch.cat(model.kept)


def test_replay_in_one_process_gives_the_union_and_the_ranks_draws(tmp_path: Any, monkeypatch: Any) -> None:
    ranks = [_ranked_run(r, 2, {"out": str(tmp_path)}, monkeypatch) for r in (0, 1)]
    trace, (received, drawn), kept = _ranked_run(0, 1, {"replay": str(tmp_path)}, monkeypatch)
    assert trace.replay == str(tmp_path) and trace.steps[0].not_comparable == ""
    assert received == [[0.0, 0.0, 1.0, 1.0, 1.0], [10.0, 10.0, 11.0, 11.0, 11.0]]  # rank 0's rows, then 1's
    for i in range(2):
        assert np.array_equal(drawn[i], np.concatenate([r[1][1][i] for r in ranks]))
    by_micro = [torch.split(r[2], [2 + n, 2 + n]) for n, r in enumerate(ranks)]
    expected = torch.cat([torch.cat([by_micro[0][i], by_micro[1][i]]) for i in range(2)])
    assert torch.equal(kept, expected)  # the draw inside the forward: each rank's rows, in rank order
    micro = trace.steps[0].micro[0]
    assert [d.call for d in micro.draws] == ["numpy.random.rand"] and micro.samples == 5
    ranks_draw = ranks[0][0].steps[0].micro[0].draws[0]
    assert ranks_draw.stream == "numpy" and ranks_draw.shape == (2,)


def _row_draws(rows: torch.Tensor, how: str) -> torch.Tensor:
    """One draw per row: from a private generator seeded by the row (``private``), from the global stream
    reseeded by the row (``reseeded``), or from the global stream as it stands (``global``)."""
    out = []
    for row in rows.tolist():
        if how == "private":
            out.append(torch.rand(1, generator=torch.Generator().manual_seed(1000 + row)))
        elif how == "reseeded":
            torch.manual_seed(1000 + row)
            out.append(torch.rand(1))
        else:
            out.append(torch.rand(1))
    return torch.cat(out)


def _keyed_run(rank: int, world: int, options: dict[str, Any], how: str, monkeypatch: Any) -> tuple[Any, Any]:
    """A 'rank' whose loop draws once per row of its batch (rank 0 rows 0-1, rank 1 rows 2-4; the replay's own
    batch is replaced by all five): what the step drew, and the trace."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    watcher = install_watcher(StepOptions(**options))
    torch.manual_seed(rank)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = torch.tensor([0, 1] if rank == 0 else [2, 3, 4]) if world > 1 else torch.arange(7)
    batch = watcher.handed("l", 0, 0, {"row": rows, "x": rows[:, None].float()})
    noise = _row_draws(batch["row"], how)
    model(batch["x"] + noise[:, None]).sum().backward()
    optimizer.step()
    trace = watcher.finish()
    uninstall()
    return trace, noise


@pytest.mark.parametrize("how", ["private", "reseeded"])
def test_draws_keyed_by_the_row_replay_faithfully(tmp_path: Any, monkeypatch: Any, how: str) -> None:
    """Each rank draws for its own rows, the replay for all five: every replayed draw starts from a state a
    rank's draw started from, so it draws the same value by itself and the step is compared."""
    ranks = [_keyed_run(r, 2, {"out": str(tmp_path)}, how, monkeypatch) for r in (0, 1)]
    trace, noise = _keyed_run(0, 1, {"replay": str(tmp_path)}, how, monkeypatch)
    assert trace.steps[0].not_comparable == ""
    assert torch.equal(noise, torch.cat([r[1] for r in ranks]))  # the ranks' own numbers, row by row
    assert len(trace.steps[0].micro[0].draws) == 5 and [len(r[0].steps[0].micro[0].draws) for r in ranks] == [
        2,
        3,
    ]


def test_global_draws_whose_count_follows_the_split_are_not_replayed(tmp_path: Any, monkeypatch: Any) -> None:
    """A draw per row from a stream no row seeds: the replay's five draws continue one stream, the ranks'
    two and three two others; no value is the right one, so the step is not compared (and says why)."""
    for r in (0, 1):
        _keyed_run(r, 2, {"out": str(tmp_path)}, "global", monkeypatch)
    trace, _ = _keyed_run(0, 1, {"replay": str(tmp_path)}, "global", monkeypatch)
    why = trace.steps[0].not_comparable
    assert "rank 0 made no such draw at this point of the step" in why, why


class Augmenting(Dataset):
    """Draws from all three global streams while loading (module level: spawned workers import it)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        import random

        return torch.rand(2) + float(np.random.rand()) + random.random()


def blind_init(worker_id: int) -> None:
    np.random.seed(worker_id)


def test_spawned_workers_report_their_fetches(watch: Any) -> None:
    """The worker_init_fn wrapper is pickled into spawned workers, the user's own still runs."""
    watcher = watch()
    loader = DataLoader(Augmenting(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                        worker_init_fn=blind_init)  # fmt: skip
    for position, batch in enumerate(loader):
        watcher.handed("spawned", 0, position, batch)
    fetches = watcher.fetch_draws(loader)
    assert fetches is not None and [(f.batch, f.worker) for f in fetches] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert all({d.stream for d in f.draws} == {"torch", "numpy", "random"} for f in fetches)
    saved = np.random.get_state()
    np.random.seed(0)
    seeded = rng.fold(rng.numpy_state() or b"")  # what blind_init(0) leaves in worker 0
    np.random.set_state(saved)
    numpy_state = [next(d.state for d in f.draws if d.stream == "numpy") for f in fetches]
    assert numpy_state[0] == seeded and numpy_state[1] != seeded


def test_batchnorm_normalises_over_the_rank(watch: Any) -> None:
    watcher = watch()
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.LayerNorm(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = watcher.handed("l", 0, 0, torch.randn(8, 4))
    model(batch).sum().backward()
    optimizer.step()
    assert watcher.finish().per_rank_norm == ("1",)


class Tokens(nn.Module):
    """A batch norm over every token's features: its rows are tokens, not the batch's samples."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x).reshape(-1, 4))


def _normed_rank(
    rank: int, world: int, options: dict[str, Any], monkeypatch: Any, tokens: bool = False
) -> Any:
    """One 'rank' of a per-rank BatchNorm model in this process (no process group); its trace."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    watcher = install_watcher(StepOptions(**options))
    torch.manual_seed(0)
    model = Tokens() if tokens else nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shape = (4, 2, 3) if tokens else (4, 3)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
    batch = watcher.handed("l", 0, 0, {"x": x if world > 1 else torch.zeros(8, *shape[1:])})
    model(batch["x"]).pow(2).mean().backward()
    optimizer.step()
    trace = watcher.finish()
    uninstall()
    return trace


def test_a_replay_normalises_each_ranks_part_by_its_own_statistics(tmp_path: Any, monkeypatch: Any) -> None:
    """Two ranks of 4 rows, each normalised by its own batch's statistics (DDP without SyncBatchNorm): the
    replay fed the union of 8 rows normalises each rank's 4 on their own, so its gradient of the mean loss
    is the ranks' average. A batch norm over tokens (rows that are not the union's samples) cannot be
    parted: that step is not comparable, and says why."""
    ranks = [_normed_rank(r, 2, {"out": str(tmp_path)}, monkeypatch) for r in (0, 1)]
    replay = _normed_rank(0, 1, {"replay": str(tmp_path)}, monkeypatch)
    assert replay.per_rank_norm == ("1",) and replay.steps[0].not_comparable == ""
    average = (np.array(ranks[0].steps[0].grad) + np.array(ranks[1].steps[0].grad)) / 2
    replayed = np.array(replay.steps[0].grad)
    assert np.linalg.norm(replayed - average) <= 1e-6 * np.linalg.norm(average)
    tokens = tmp_path / "tokens"
    for r in (0, 1):
        _normed_rank(r, 2, {"out": str(tokens)}, monkeypatch, tokens=True)
    refused = _normed_rank(0, 1, {"replay": str(tokens)}, monkeypatch, tokens=True)
    assert "BatchNorm (norm) normalises 16 rows, the union holds 8 samples" in refused.steps[0].not_comparable


def test_a_loader_one_batch_ahead_gives_each_backward_the_batch_it_consumed() -> None:
    """Accelerate's DataLoaderShard hands batch k+1 before the loop gets batch k: handed, the first backward
    holds two batches and the epoch's last none. Read in order, each backward gets its own (an all-masked
    batch 1 is no longer hidden beside batch 0). A peek before the loop, two loaders at once, or a backward
    with no batch fetched for it keep what was handed."""
    from ddpcheck.checker.step import fetched_ahead
    from ddpcheck.trace import MicroStep

    def part(epoch: int, position: int, labelled: int) -> Any:
        return (("train", epoch, position), 4, labelled)

    handed = [[part(0, 0, 7), part(0, 1, 0)], [part(0, 2, 5)], [], [part(1, 0, 3), part(1, 1, 9)], []]
    micro = [MicroStep("train", 0, (), 0, None) for _ in handed]
    ahead = fetched_ahead(micro, handed)
    assert ahead is not None
    assert [(m.epoch, m.batches, m.supervised) for m in ahead] == [
        (0, (0,), 7), (0, (1,), 0), (0, (2,), 5), (1, (0,), 3), (1, (1,), 9)
    ]  # fmt: skip
    cut = [[part(0, 0, 7), part(0, 1, 0)], []]  # the epoch cut after 2 batches (--model-steps 2)
    assert [m.batches for m in fetched_ahead(micro[:2], cut) or ()] == [(0,), (1,)]
    left = [[part(0, 0, 7), part(0, 1, 0)], [part(0, 2, 5)]]  # the loop broke off: batch 2 never consumed
    assert [m.batches for m in fetched_ahead(micro[:2], left) or ()] == [(0,), (1,)]
    peek = [[(("train", 0, 0), 4, 1), part(1, 0, 7)], [part(1, 1, 5)]]  # the tutorial's peek, then epoch 1
    assert fetched_ahead(micro[:2], peek) is None
    plain = [[part(0, 0, 7)], [part(0, 1, 5)]]
    assert fetched_ahead(micro[:2], plain) is None
    behind = [[], [part(0, 0, 7), part(0, 1, 5)]]  # a backward before any batch
    assert fetched_ahead(micro[:2], behind) is None
    pairs = [[part(0, 0, 7), part(0, 1, 5)], [part(0, 2, 5), part(0, 3, 1)]]  # two batches per backward
    assert fetched_ahead(micro[:2], pairs) is None


def test_a_window_fetched_ahead_gives_each_backward_its_own_batch() -> None:
    from ddpcheck.checker.step import one_batch_each
    from ddpcheck.trace import MicroStep

    fetched = [MicroStep("train", 0, (0, 1), 8, 30), MicroStep("train", 0, (), -1, None)]
    parts = [[(("train", 0, 0), 4, 7), (("train", 0, 1), 4, 23)], []]  # HF Trainer: both before backward
    split = one_batch_each(fetched, parts)
    assert [(m.batches, m.samples, m.supervised) for m in split] == [((0,), 4, 7), ((1,), 4, 23)]
    plain = [MicroStep("train", 0, (0,), 4, 7), MicroStep("train", 0, (1,), 4, 23)]
    assert one_batch_each(plain, [[parts[0][0]], [parts[0][1]]]) == tuple(plain)
    behind = [MicroStep(), MicroStep("train", 0, (0, 1), 8, 30)]  # a padding pass before any batch: as is
    assert one_batch_each(behind, [[], parts[0]]) == tuple(behind)
    more = [MicroStep("train", 0, (0, 1, 2), 12, 40), MicroStep()]  # three batches for two backward passes
    assert one_batch_each(more, [[*parts[0], (("train", 0, 2), 4, 10)], []]) == tuple(more)


def _shared_run(rank: int, world: int, options: dict[str, Any], monkeypatch: Any) -> tuple[Any, Any]:
    """A step-wide draw from a generator seeded alike on every rank and in the replay (one noise level
    for the step), then noise per row from the rank's own global stream."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    watcher = install_watcher(StepOptions(**options))
    torch.manual_seed(rank)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shared = torch.Generator().manual_seed(7)
    rows = 2 + rank if world > 1 else 9
    batch = watcher.handed("l", 0, 0, {"x": torch.ones(rows, 1)})
    level = torch.rand(1, generator=shared)
    noise = torch.randn(len(batch["x"]), 1)
    model(batch["x"] * level + noise).sum().backward()
    optimizer.step()
    trace = watcher.finish()
    uninstall()
    return trace, (level, noise)


def test_a_step_wide_draw_keyed_alike_stands_for_every_ranks(tmp_path: Any, monkeypatch: Any) -> None:
    """The level is one draw on each rank from the same state; the replay draws it from that state too and
    stands for every rank's, and the per-row noise that follows is the ranks' noise joined."""
    ranks = [_shared_run(r, 2, {"out": str(tmp_path)}, monkeypatch) for r in (0, 1)]
    trace, (level, noise) = _shared_run(0, 1, {"replay": str(tmp_path)}, monkeypatch)
    assert trace.steps[0].not_comparable == ""
    assert torch.equal(level, ranks[0][1][0]) and torch.equal(noise, torch.cat([r[1][1] for r in ranks]))
