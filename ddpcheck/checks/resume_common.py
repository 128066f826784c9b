"""What every resume judge shares: streams compared batch by batch, the loader file's resume hooks by
name, and the causes more than one judge names (with their fixes). Plain functions of plain data."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from ddpcheck.restores import Batches

RESUME_HOOK = "resume_loader"  # the loader file's hooks, by the names the rank side looks up
SAVE_HOOK = "save_state"
LOAD_HOOK = "load_state"
HOOK = RESUME_HOOK

HOW_TO_ENABLE = (
    "the loader has no state to resume from: give the loader, its sampler or its batch sampler "
    "state_dict()/load_state_dict() (torchdata's StatefulDataLoader, ddpcheck's DDPSamplerWrapper), or "
    f"define {HOOK}(loader, epoch, step, samples_seen) in the loader file"
)


def flat(batches: Iterable[Sequence[Hashable]]) -> list[Hashable]:
    return [i for b in batches for i in b]


def first_difference(expected: Batches, got: Batches, in_order: bool = True) -> int | None:
    """The first batch where ``got`` leaves ``expected`` (None: never). Out-of-order loaders compare
    their batches as a multiset: with ``in_order=False`` any order is the loader's contract."""
    if not in_order:
        key = lambda batch: sorted(map(repr, batch))  # noqa: E731
        return None if sorted(map(key, expected)) == sorted(map(key, got)) else 0
    for j, (a, b) in enumerate(zip(expected, got, strict=False)):
        if sorted(map(repr, a)) != sorted(map(repr, b)):
            return j
    return None if len(expected) == len(got) else min(len(expected), len(got))


def via(mechanism: str) -> str:
    """How a report names where the state lives: the file's hooks by their names."""
    return f"{SAVE_HOOK}/{LOAD_HOOK}" if mechanism == "hooks" else mechanism


def batches_text(n: int) -> str:
    """``1 batch``, ``3 batches``."""
    return f"{n} batch" if n == 1 else f"{n} batches"


def shift_of(epoch: Batches, got: Batches) -> int | None:
    """Where in ``epoch`` the stream ``got`` starts when it is the epoch's tail from there (None: it is
    no tail of the epoch). An empty ``got`` says nothing."""
    return next((k for k in range(len(epoch) + 1) if list(got) == list(epoch[k:])), None)


BOUNDARY_REPLAY = (
    "stopped after the epoch's last step, the restored loader runs that finished epoch again instead of "
    "the next one: the saved state does not mark the epoch finished (a loader that fetches a batch "
    "ahead saves before its last batch is handed out), so a job restored at an epoch's end trains an "
    "epoch twice"
)
BOUNDARY_EMPTY = (
    "stopped after the epoch's last step, the restored loader yields nothing in the next epoch: the "
    "'finished' state is applied to the next pass, so a job restored at an epoch's end skips an epoch"
)


NOT_ELASTIC = {
    "hook": "resume_loader skips a per-rank count: at another world size the shards change, so the "
    "position must come from samples_seen over the global order (not elastic)",
}
NOT_ELASTIC_STATE = (
    "restored at another world size, the saved data state does not continue the same global order: "
    "not elastic"
)
RANK0_STATE = (
    "every rank restored the same state (only rank 0 saves, or every rank loads rank 0's file): the "
    "ranks restart from one rank's position and shard, so samples are trained twice or never"
)
RANK0_SAVED = (
    "only rank 0 saves the data state and every rank restores from it: a loader that keys its state by "
    "rank (torchtitan's ParallelAwareDataloader: 'dp_rank_<r>') finds none of its own on the other "
    "ranks, which start their epoch over (or resume at rank 0's position) while rank 0 resumes"
)
GLOBAL_RANK_STATE = (
    "the state is keyed by the global rank, but the data is sharded by the data-parallel rank: a rank "
    "of the new mesh loads the state of an old rank that held another shard (load the state of the old "
    "rank with the same data-parallel rank, with a load_state hook)"
)
WORKER_OFFSETS = (
    "restored with another number of DataLoader workers, the state's per-worker positions do not carry "
    "over: samples of the old workers' shards are lost or repeated"
)
ROUNDED_TO_BATCHES = (
    "the restore reshards at whole-batch granularity: the saved position is rounded to the new layout's "
    "global batch (litdata's elastic resume rounds down, then drops a ragged tail), so a stop off such a "
    "boundary repeats or loses fewer samples than one global batch"
)
TOPOLOGY_FIXES = {  # and the resume causes that have one
    BOUNDARY_REPLAY: "save the loader's state after its iterator is exhausted (torchdata's "
    "StatefulDataLoader marks the epoch finished then), or start the next epoch without loading a state "
    "saved at an epoch's end",
    BOUNDARY_EMPTY: "start the next epoch from a fresh iterator (call iter() once more), or save the state "
    "after the epoch's loop has ended",
    ROUNDED_TO_BATCHES: "checkpoint where the samples seen are a multiple of the new layout's global batch "
    "(data-parallel size x workers x batch size), or accept the few repeats with --allow elastic_resume",
    RANK0_STATE: "save every rank's state and load old rank r's into new rank r (the default), or write "
    "a load_state hook that reads every old rank's",
    RANK0_SAVED: "save the data state on every rank, not only rank 0 (torchtitan's checkpointer saves "
    "the dataloader on every rank, each dp rank under its own key), and load rank r's into rank r",
    GLOBAL_RANK_STATE: "key the saved state by the data-parallel rank (a load_state hook that picks the old "
    "rank with the same dp_rank)",
    WORKER_OFFSETS: "restore with the saved number of workers, or keep per-worker offsets that reshard "
    "(litdata does)",
    NOT_ELASTIC_STATE: "save a position in the global order (samples_seen) instead of a per-rank one, or "
    "restart elastic jobs at an epoch's start",
}
