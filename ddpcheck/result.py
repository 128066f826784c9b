"""The outcome of a whole ddpcheck run: verdicts per world size, rank failures, divergence rows.

Reports are rendered from this alone; they never recompute a check.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ddpcheck.exits import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_RANK_FAILED
from ddpcheck.figures import FigureData
from ddpcheck.layout import Layout
from ddpcheck.messages import count_text
from ddpcheck.options import CheckOptions
from ddpcheck.restores import ResumeRow
from ddpcheck.trace import RankFailure
from ddpcheck.verdict import Verdict


@dataclass(frozen=True)
class MetricRow:
    """One metric at one world size: the reference, the naive DDP gather and the corrected one."""

    metric: str
    reference: float
    naive: float
    corrected: float
    duplicated: int = 0
    dropped: int = 0
    order_only: bool = False
    cause: str = ""

    @property
    def effects(self) -> str:
        """``duplicated 3; dropped 1`` / ``order only``: what the naive gather got wrong, tersely."""
        return "; ".join(
            gather_effects(self.duplicated, self.dropped, order_only=self.order_only, terse=True)
        )

    @property
    def naive_diff(self) -> float:
        return self.naive - self.reference

    @property
    def corrected_diff(self) -> float:
        return self.corrected - self.reference


def gather_effects(
    duplicated: int, dropped: int, extra: int = 0, *, order_only: bool = False, terse: bool = False
) -> list[str]:
    """What a naive gather of every rank's outputs differs by: one phrase per effect, in one order.

    ``terse`` for table cells (``duplicated 3``), else for sentences (``3 padding duplicates``).
    """
    counted = (
        (duplicated, "duplicated", "padding duplicates"),
        (dropped, "dropped", "dropped samples"),
        (extra, "unexpected", "unexpected samples"),
    )
    parts = [f"{word} {n}" if terse else count_text(n, noun) for n, word, noun in counted if n]
    if order_only:
        parts.append("order only" if terse else "rank-major order")
    return parts


@dataclass(frozen=True)
class WorldResult:
    """Everything decided about one layout: a world size, or a device mesh (``layout``)."""

    world_size: int
    backend: str
    verdicts: tuple[Verdict, ...] = ()
    failures: tuple[RankFailure, ...] = ()
    skipped: str = ""
    divergence: tuple[MetricRow, ...] = ()
    seconds: float = 0.0
    resume: tuple[ResumeRow, ...] = ()
    figures: FigureData | None = None  # picture data for the HTML/Markdown reports (ddpcheck.figures)
    layout: Layout | None = None  # None: the plain world size ``world_size``
    loader: str = ""  # a training script's loader (``train.py:42``); "" for a loader file's one loader
    loader_variable: str = ""  # the variable the script assigned that loader to (``train_loader``); "" none

    @property
    def ok(self) -> bool:
        return not self.failures and not any(v.failed for v in self.verdicts)

    @property
    def label(self) -> str:
        """``2`` for a world size, ``dp=2,tp=2`` for a mesh; ``train.py:42 2`` for a script's loader."""
        base = self.layout.label if self.layout is not None else str(self.world_size)
        return f"{self.loader} {base}" if self.loader else base


@dataclass(frozen=True)
class ScriptRun:
    """A training script's run (``ddpcheck run``): the script as shown, its own arguments, the batches an
    epoch its loop received (None: whole epochs) and the working directory it ran in."""

    script: str
    args: tuple[str, ...] = ()
    model_steps: int | None = None
    cwd: str = ""


UNLISTED = ("factory_args", "option_sources", "config_file")  # listed after the others, only when set


@dataclass(frozen=True)
class RunRecord:
    """What a run was asked to do, as the reports list it: the options (None: a result made by hand), and
    which kind of run it was: a script's (``script``), a directory judged (``judged``, from a
    ``--fingerprint`` launch or not), a joined launch."""

    options: CheckOptions | None = None
    script: ScriptRun | None = None
    judged: str = ""
    fingerprint: bool = False
    joined: bool = False

    def as_data(self) -> dict[str, Any]:
        """The options as the JSON report lists them: every field (meshes as specs), the factory's
        arguments, where values came from and the config file where set; then the run's kind."""
        out: dict[str, Any] = {}
        options = self.options
        if options is not None:
            out = {f.name: getattr(options, f.name) for f in fields(options) if f.name not in UNLISTED}
            out["world_sizes"] = list(options.world_sizes)
            out["meshes"] = [m.spec if isinstance(m, Layout) else m for m in options.meshes]
            if options.factory_args:
                out["factory_args"] = dict(options.factory_args)
            if options.option_sources:
                out["option_sources"] = dict(options.option_sources)
            if options.config_file:
                out["config_file"] = options.config_file
        if self.script is not None:
            steps = self.script.model_steps
            out.update(
                script=self.script.script,
                script_args=list(self.script.args),
                model_steps="all" if steps is None else steps,
                cwd=self.script.cwd,
            )
        if self.judged:
            out["judged"] = self.judged
        if self.fingerprint:
            out["fingerprint"] = True
        if self.joined:
            out["joined"] = True
        return out


@dataclass(frozen=True)
class CheckResult:
    """A whole run: one loader file (or factory), several world sizes."""

    loader: str
    runs: tuple[WorldResult, ...]
    id_source: str = "index"
    epochs: int = 2
    options: RunRecord = RunRecord()
    notes: tuple[str, ...] = ()  # things the user should know, e.g. "ids are content hashes"
    interrupted: bool = False  # Ctrl-C or SIGTERM: only the world sizes in ``runs`` were checked

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(run.ok for run in self.runs)

    @property
    def verdict_word(self) -> str:
        """``passed``, ``failed`` or ``interrupted``: what every report's headline says."""
        return "interrupted" if self.interrupted else "passed" if self.ok else "failed"

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if any(run.failures for run in self.runs):
            return EXIT_RANK_FAILED
        if not self.ok:
            return EXIT_CHECK_FAILED
        return EXIT_OK
