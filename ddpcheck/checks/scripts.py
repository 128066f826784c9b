"""What the checks say of a training script (``ddpcheck run``, ``ddpcheck judge``) rather than a loader file.

The loader-file texts that name a loader file's hooks or ``CheckOptions`` are said in a script's words;
a script whose ranks never joined a process group is told to start them with its framework's launcher
(a DistributedSampler cannot split without a group); launcher variables left in the environment, which
make a framework believe in another number of processes, are named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ddpcheck.checks.diagnose import IGNORES_RANK, TOLD_REPLICAS
from ddpcheck.checks.fixes import FIXES
from ddpcheck.checks.ids import RNG_INDEPENDENCE
from ddpcheck.checks.mixture import NO_SOURCE
from ddpcheck.checks.replicas import (
    GLOBAL_RANK,
    LAYOUT_MISMATCH,
    MESH_FIXES,
    REPLICA_IDS,
    TOLD,
    TOLD_GLOBAL,
    told_split,
)
from ddpcheck.checks.reshuffle import NOT_FORWARDED
from ddpcheck.checks.verdict import Verdict
from ddpcheck.checks.work import NO_WORK
from ddpcheck.layout import Layout
from ddpcheck.trace import RunTrace

_NOT_FORWARDED_FIX = next(fix for text, fix in FIXES if text == NOT_FORWARDED.split("{")[0])
SCRIPT_WORDS: dict[str, str] = {
    NO_SOURCE: "batches carry no source: give dict batches a 'source' field, or define sample_source(batch) "
    "in a --hooks file, to check a mixture",
    NO_WORK: "batches carry no tokens (input_ids, attention_mask, position_ids) and no --hooks file defines "
    "batch_work(batch): every sample counts the same, balanced when the steps are",
    _NOT_FORWARDED_FIX: "call the wrapped part's set_epoch in the loop (the loader does not pass it on)",
}

ALONE = "no rank joined a process group: each process trains alone on everything its loader yields"
LIGHTNING_ALONE = (
    "; Lightning ran one device per process (under torchrun it takes devices and strategy from its "
    "arguments or from fabric run's LT_DEVICES/LT_STRATEGY, not from the launch)"
)
ALONE_FIX = (
    "start the processes as the script's framework expects, so they join one group: Lightning: "
    'Fabric(devices=N, strategy="ddp") then fabric.launch(), or fabric run --devices N train.py '
    '(Trainer: devices=N, strategy="ddp"); plain torch: init_process_group() in every process; a '
    "DistributedSampler cannot split without a group"
)
SAMPLER = "the sampler "
AT_THE_SAMPLER = (TOLD, GLOBAL_RANK, TOLD_REPLICAS)  # causes that name the loader's sampler
# variables a launcher sets that a framework reads over the script's own arguments
LAUNCHER_VARIABLES = ("LT_DEVICES", "LT_NUM_NODES", "LT_STRATEGY", "LT_ACCELERATOR", "LT_PRECISION")


def in_script_words(verdict: Verdict) -> Verdict:
    """``verdict`` with loader-file words (its hooks, CheckOptions) said as a script's."""
    changed = {}
    for name in ("detail", "cause", "fix"):
        text = getattr(verdict, name)
        for loader_file, script in SCRIPT_WORDS.items():
            if loader_file in text:
                text = text.replace(loader_file, script)
        if text != getattr(verdict, name):
            changed[name] = text
    return replace(verdict, **changed) if changed else verdict


def told_cause(verdict: Verdict, run: RunTrace, layout: Layout) -> Verdict:
    """A mesh failure the data reads as a split by a non-data coordinate, named from what the script's
    samplers were given (:func:`~ddpcheck.checks.replicas.told_split`): ``dist.get_rank()`` and the
    data-parallel rank it needs. A transposed-looking split may also be a ``--mesh`` declared in another
    order than the script's own mesh: the cause says both."""
    mesh_causes = (GLOBAL_RANK, REPLICA_IDS, LAYOUT_MISMATCH)
    if not layout.mesh or not verdict.failed or verdict.cause not in mesh_causes:
        return verdict
    told = told_split(run, layout)
    if not told:
        return verdict
    if verdict.cause == LAYOUT_MISMATCH and not told.startswith(TOLD_GLOBAL):
        told += f"; or --mesh {layout.spec} is declared in another order than the script builds its mesh"
    return replace(verdict, cause=told, fix=MESH_FIXES[GLOBAL_RANK])


def at_loader(verdict: Verdict, name: str) -> Verdict:
    """A cause that blames the loader's sampler, said at the line that built the loader (``name``)."""
    if not verdict.cause.startswith(AT_THE_SAMPLER) or not verdict.cause.startswith(SAMPLER):
        return verdict
    where = f"the sampler of the loader built at {name} "
    return replace(verdict, cause=where + verdict.cause.removeprefix(SAMPLER))


def alone(verdict: Verdict, joined: bool, frameworks: Iterable[str]) -> Verdict:
    """A failure of ranks that never joined a process group (``joined`` False), named as that, with the
    launcher as its fix; any other verdict as it is."""
    if joined or not verdict.failed:
        return verdict
    # ranks alone draw alike too (each seeds and shuffles as the only process): the same cause
    if IGNORES_RANK not in verdict.cause and verdict.check != RNG_INDEPENDENCE:
        return verdict
    cause = ALONE + (LIGHTNING_ALONE if "lightning" in frameworks else "")
    return replace(verdict, cause=cause, fix=ALONE_FIX)


def launcher_note(environ: Mapping[str, str]) -> str:
    """A note naming the launcher variables set in the environment every rank inherits, or ""."""
    found = [f"{name}={environ[name]}" for name in LAUNCHER_VARIABLES if environ.get(name)]
    if not found:
        return ""
    return (
        f"the environment sets {', '.join(found)} (Lightning Fabric's launcher variables, what fabric run "
        "sets): Fabric reads them over the script's own arguments, at every world size ddpcheck runs"
    )
