"""One view of a :class:`~ddpcheck.result.CheckResult`, computed once; every format renders it.

The view holds what any report shows: a row per layout (its cells, its ranks, its padding), each distinct
cause once with the checks and layouts it explains, how to fix it and its evidence (once per check, not
once per layout), the rank failures, the skip and n/a reasons, the notes. Formats (table, Markdown, HTML,
JUnit, JSON, GitHub annotations) only lay it out, so they can never disagree on what passed, and nothing
here re-runs or re-judges a check.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ddpcheck.evidence import PaddingCost, RestoreLog, WorkBalance
from ddpcheck.messages import count_text, short_id, spans
from ddpcheck.report.metric_view import MetricTable, metric_table
from ddpcheck.report.mixture_view import MixtureTable, mixture_table
from ddpcheck.report.rows import Cell, Row, restore_outcome
from ddpcheck.report.step_view import StepTable, step_table
from ddpcheck.restores import ResumeRow
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.trace import RankFailure
from ddpcheck.verdict import ALL_CHECKS, PADDING_BOUND, PASS, SHORT_LABELS, WORK_BALANCE, Verdict

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "n/a": "n/a", "allowed": "allowed"}
STATUS_RANK = ("fail", "allowed", "pass", "skip", "n/a")  # a cell with several verdicts shows the first
NO_CAUSE = "cause not identified"
NOT_RUN = "-"
FAILURE_VERB = {
    "error": "crashed",
    "hang": "hung",
    "overtime": "ran past --max-time",
    "killed": "was killed",
    "secondary": "aborted",
}
MAX_LISTED = 12  # ranks / epochs / examples shown before "(+N more)"
MAX_EXAMPLE_CHARS = 60
STACK_LINES = 20
CAUSE_KINDS = ("fail", "rank", "allowed")
RESUME_HEADERS = (
    "topology", "epoch", "stop at step", "outcome", "before", "after", "lost", "repeated",
    "first divergence", "note",
)  # fmt: skip


# ------------------------------------------------------------------ the view


@dataclass(frozen=True)
class Counts:
    """What the summary line and the JUnit suite count; a skipped layout counts as one skip.

    ``allowed`` failures and ``n/a`` checks are counted apart: neither passed, neither failed.
    """

    passed: int
    failed: int
    skipped: int
    rank_failures: int
    world_sizes: tuple[int, ...]
    not_applicable: int = 0
    allowed: int = 0
    meshes: tuple[str, ...] = ()  # the mesh layouts' specs, in order


@dataclass(frozen=True)
class Finding:
    """The evidence of one check under one cause: shown once, at the first layout; ``also`` the others."""

    check: str
    status: str  # fail | allowed
    where: str
    also: tuple[str, ...]
    detail: str
    evidence: tuple[tuple[str, str], ...]  # (label, text), the cause left out


@dataclass(frozen=True)
class Cause:
    """One distinct reason for failures, listed once with everything it explains.

    ``kind`` is ``fail`` (failed checks), ``allowed`` (failed, allowed with ``--allow``) or ``rank``
    (ranks that crashed, hung or were killed; the peers they took down are not listed as causes).
    ``where`` pairs each layout with what failed there: a check id, or ``rank N``.
    """

    number: int
    kind: str
    text: str
    where: tuple[tuple[WorldResult, str], ...]
    explains: str = ""
    fix: str = ""
    findings: tuple[Finding, ...] = ()

    @property
    def title(self) -> str:
        """The cause as its list line says it: allowed ones are marked, so they never read as failures."""
        return f"(allowed) {self.text}" if self.kind == "allowed" else self.text


@dataclass(frozen=True)
class FailureEntry:
    """A rank that crashed, hung or was killed, at a layout; ``cause`` None for peers taken down."""

    where: str
    failure: RankFailure
    cause: int | None


@dataclass(frozen=True)
class Reason:
    """Why a check was skipped or does not apply, merged over the layouts that say the same."""

    where: str
    check: str
    why: str


@dataclass(frozen=True)
class ReportView:
    result: CheckResult
    counts: Counts
    columns: tuple[str, ...]
    with_backend: bool
    rows: tuple[Row, ...]
    causes: tuple[Cause, ...]
    failures: tuple[FailureEntry, ...]
    skipped: tuple[Reason, ...]
    not_applicable: tuple[Reason, ...]

    @property
    def grid_columns(self) -> tuple[str, ...]:
        """The checks the text grids show (terminal, Markdown): a check that applies to no layout (n/a
        everywhere) is left out, its reason listed under "Not applicable"; HTML, JSON and JUnit keep
        every check."""
        shown = tuple(
            c for c in self.columns if any(row.cell(c).status not in ("n/a", None) for row in self.rows)
        )
        return shown or self.columns

    @property
    def legend(self) -> str:
        return ", ".join(f"{SHORT_LABELS[c]} = {c}" for c in self.grid_columns if SHORT_LABELS.get(c, c) != c)

    @property
    def subject(self) -> str:
        """What was checked, as a report's header names it: Script, Traces (``ddpcheck judge``) or Loader."""
        record = self.result.options
        return "Script" if record.script is not None else "Traces" if record.judged else "Loader"

    @property
    def grid_rows(self) -> tuple[Row, ...]:
        """The rows as the grids show them: a script's loaders each with its layouts together (loaders in
        the order first seen), a loader file's in run order."""
        order = {loader: n for n, loader in enumerate(dict.fromkeys(row.loader for row in self.rows))}
        return tuple(sorted(self.rows, key=lambda row: order[row.loader]))

    @property
    def loader_column(self) -> bool:
        """The grid gives a script's loaders a column of their own."""
        return any(row.loader for row in self.rows)

    @property
    def pictured(self) -> tuple[Row, ...]:
        """Rows with pictures, failing layouts first (what a reader opens the pictures for), then in
        run order."""
        rows = [row for row in self.rows if row.run.figures is not None]
        return tuple(sorted(rows, key=lambda row: not row.failing))

    @property
    def measured(self) -> tuple[Row, ...]:
        """Rows whose work was measured (their idle fraction is shown)."""
        return tuple(row for row in self.rows if row.idle)

    @property
    def padded(self) -> tuple[Row, ...]:
        """Rows whose padding repeated samples (what a user evaluating on the loader pays)."""
        return tuple(row for row in self.rows if row.padding not in ("", "none"))

    def summary(self, paint: Callable[[str, str], str] | None = None) -> str:
        return summary_line(self.result, paint, self.counts)

    @functools.cached_property
    def mixtures(self) -> tuple[MixtureTable, ...]:
        """Per layout whose batches carry a source, each source's share per rank and worker (once)."""
        return tuple(t for t in (mixture_table(row) for row in self.rows) if t is not None)

    @functools.cached_property
    def step_tables(self) -> tuple[StepTable, ...]:
        """Per layout whose training step was compared with one process's, each compared step (once)."""
        return tuple(t for t in (step_table(row) for row in self.rows) if t is not None)

    @functools.cached_property
    def metric_tables(self) -> tuple[MetricTable, ...]:
        """Per layout whose evaluation was compared with one process's, each compared value (once)."""
        return tuple(t for t in (metric_table(row) for row in self.rows) if t is not None)


def as_view(source: CheckResult | ReportView) -> ReportView:
    return source if isinstance(source, ReportView) else build_view(source)


def build_view(result: CheckResult) -> ReportView:
    """The view of ``result`` (pure; a report that writes several formats builds it once)."""
    result = shown_loaders(result)
    with_backend = show_backend(result)
    found = causes(result)
    columns = check_columns(result)
    rows = tuple(_row(run, columns, with_backend, found) for run in result.runs)
    failures = tuple(
        FailureEntry(world_label(run, with_backend), failure, _failure_cause(found, run, failure))
        for run in result.runs
        for failure in run.failures
    )
    return ReportView(
        result=result,
        counts=count(result),
        columns=columns,
        with_backend=with_backend,
        rows=rows,
        causes=tuple(found),
        failures=failures,
        skipped=tuple(skip_reasons(result, "skip")),
        not_applicable=tuple(skip_reasons(result, "n/a")),
    )


def _row(run: WorldResult, columns: Sequence[str], with_backend: bool, found: Sequence[Cause]) -> Row:
    cells = []
    for check in columns:
        verdicts = [v for v in run.verdicts if v.check == check]
        status = cell_status(run, check)
        failing = next((v for v in verdicts if v.status in ("fail", "allowed")), None)
        number = cause_number(found, failing) if failing is not None else None
        tip = "; ".join(v.detail for v in verdicts if v.detail)
        cells.append(Cell(check, status, tip, number))
    label = world_label(run, with_backend)
    short = world_label(run, with_backend, loader=False).removeprefix("ws=")
    return Row(run, label, short, anchor(run, with_backend), tuple(cells), ranks_text(run), padding_text(run),
               idle_text(run), run.loader)  # fmt: skip


def anchor(run: WorldResult, with_backend: bool) -> str:
    """An id for links and picture file names: ``ws2``, ``dp2-tp2``; short and unique however long or
    non-ASCII the mesh label (the layout's own file name: ``dp=12`` and ``dp1=2`` differ)."""
    base = run.layout.file_name if run.layout is not None and run.layout.mesh else f"ws{run.world_size}"
    if run.loader:  # a script's loader: its name's plain part, a hash where that loses anything
        plain = re.sub(r"[^A-Za-z0-9_]+", "-", run.loader).strip("-")
        if len(plain) > 24 or plain != run.loader:
            digest = hashlib.sha256(run.loader.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            plain = f"{plain[:24].strip('-')}-{digest}".strip("-")
        base = f"{plain}-{base}"
    return f"{base}-{run.backend}" if with_backend else base


def _failure_cause(found: Sequence[Cause], run: WorldResult, failure: RankFailure) -> int | None:
    if failure.kind == "secondary":
        return None
    text = f"{FAILURE_VERB.get(failure.kind, failure.kind)}: {first_line(failure.message)}"
    return next((c.number for c in found if c.kind == "rank" and c.text == text), None)


# ------------------------------------------------------------------ pieces of the view


def shown_loaders(result: CheckResult) -> CheckResult:
    """A script's loaders named as its code names them (:func:`loader_names`), in every report."""
    if not any(run.loader for run in result.runs):
        return result
    names = loader_names(result.runs)
    runs = tuple(replace(run, loader=names[run.loader]) if run.loader else run for run in result.runs)
    return replace(result, runs=runs)


def loader_names(runs: Sequence[WorldResult]) -> dict[str, str]:
    """Each script loader's name in the reports: the variable the script assigned it to (``train_loader``),
    followed by the line that built it where two loaders share the variable (``loader (train.py:42)``);
    the line alone where it assigned none. The line is the rank's, relative to the script's folder."""
    variables: dict[str, str] = {}
    for run in runs:
        if run.loader:
            variables.setdefault(run.loader, run.loader_variable)
    shared = Counter(v for v in variables.values() if v)
    return {
        site: site if not variable else variable if shared[variable] == 1 else f"{variable} ({site})"
        for site, variable in variables.items()
    }


def check_columns(result: CheckResult) -> tuple[str, ...]:
    """Check ids seen in any run: known ids in ``ALL_CHECKS`` order, then unknown ones as first seen."""
    seen: list[str] = []
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.check not in seen:
                seen.append(verdict.check)
    known = [c for c in ALL_CHECKS if c in seen]
    return (*known, *(c for c in seen if c not in ALL_CHECKS))


def show_backend(result: CheckResult) -> bool:
    """Name the backend next to the layout only when runs used more than one."""
    return len({run.backend for run in result.runs}) > 1


def world_label(run: WorldResult, with_backend: bool, *, loader: bool = True) -> str:
    """``ws=2`` for a world size, ``dp=2,tp=2`` for a mesh (with the backend when runs used several);
    ``train.py:42 ws=2`` for a script's loader (``loader=False``: the layout alone)."""
    label = run.layout.label if run.layout is not None and run.layout.mesh else f"ws={run.world_size}"
    if run.loader and loader:  # a training script's loader: its row group is named by the line that built it
        label = f"{run.loader} {label}"
    return f"{label} {run.backend}" if with_backend else label


def cell_status(run: WorldResult, check: str) -> str | None:
    """The status of ``check`` in ``run`` (fail, allowed, pass, skip, n/a: the first present wins),
    ``None`` when it did not run."""
    statuses = [v.status for v in run.verdicts if v.check == check]
    if not statuses:
        return None
    for status in STATUS_RANK:
        if status in statuses:
            return status
    return statuses[0]


def ranks_text(run: WorldResult) -> str:
    parts = []
    if run.skipped:
        parts.append(f"skipped: {run.skipped}")
    if run.failures:
        parts.append(rank_summary(run.failures))
    return "; ".join(parts) if parts else "ok"


def idle_text(run: WorldResult) -> str:
    """``14%, 12% (random batching: 16%, 17%)``: the share of rank-steps the ranks would wait for the
    slowest, per epoch, from work_balance's data; "" when work was not measured."""
    verdict = next((v for v in run.verdicts if v.check == WORK_BALANCE), None)
    balance = verdict.evidence if verdict is not None else None
    if not isinstance(balance, WorkBalance) or not balance.idle:
        return ""
    shown = ", ".join(f"{float(x):.0%}" for x in balance.idle)
    return f"{shown} (random batching: {', '.join(f'{float(x):.0%}' for x in balance.random_batching_p99)})"


def padding_text(run: WorldResult) -> str:
    """``4 padding copies of 64 samples (6%)``, ``1 padding copy of 12 batches (8%)``: the padding a
    passing layout still costs, from padding_bound's data (the most in any epoch, in what the check
    counted); where it fails, the copies named as overlap between ranks ("23 extra copies of 96 samples
    (24%): overlap between ranks (at most 1 can be padding)"); ``none``; or "" when not judged."""
    verdict = next((v for v in run.verdicts if v.check == PADDING_BOUND), None)
    cost = verdict.evidence if verdict is not None else None
    if verdict is None or not isinstance(cost, PaddingCost):
        return ""
    copies, samples = cost.copies, cost.samples
    if not isinstance(copies, int) or not isinstance(samples, int) or samples <= 0:
        return ""
    if copies == 0:
        return "none"
    noun = cost.noun or "samples"  # samples, batches, rows: what the check counted
    share = f"of {count_text(samples, noun)} ({copies / samples:.0%})"
    bound = cost.bound
    if verdict.status == PASS or not isinstance(bound, int):
        return f"{count_text(copies, 'padding copies')} {share}"  # what the sampler adds by design
    padding = f"at most {bound} can be padding" if bound else "the sampler adds no padding"
    return f"{count_text(copies, 'extra copies')} {share}: overlap between ranks ({padding})"


def count(result: CheckResult) -> Counts:
    """Verdicts by status; an unknown status counts as a skip (it could not be judged as pass/fail)."""
    tally = dict.fromkeys(STATUS_RANK, 0)
    for run in result.runs:
        if run.skipped:
            tally["skip"] += 1
        for verdict in run.verdicts:
            tally[verdict.status if verdict.status in tally else "skip"] += 1
    meshes = tuple(
        dict.fromkeys(run.label for run in result.runs if run.layout is not None and run.layout.mesh)
    )
    sizes = tuple(dict.fromkeys(run.world_size for run in result.runs if run.label not in meshes))
    return Counts(
        meshes=meshes,
        passed=tally["pass"],
        failed=tally["fail"],
        skipped=tally["skip"],
        rank_failures=sum(len(run.failures) for run in result.runs),
        world_sizes=sizes,
        not_applicable=tally["n/a"],
        allowed=tally["allowed"],
    )


def summary_line(
    result: CheckResult, paint: Callable[[str, str], str] | None = None, counts: Counts | None = None
) -> str:
    """``ddpcheck: 27 passed, 2 failed, 3 n/a, 1 allowed, 1 skipped across world sizes 1,2 -> OK (exit 0)``.

    ``n/a`` and ``allowed`` appear only when there are some; the other counts always do.
    """
    c = counts or count(result)
    parts = [f"{c.passed} passed", f"{c.failed} failed"]
    if c.not_applicable:
        parts.append(f"{c.not_applicable} n/a")
    if c.allowed:
        parts.append(f"{c.allowed} allowed")
    parts.append(f"{c.skipped} skipped")
    if c.rank_failures:
        parts.append(count_text(c.rank_failures, "rank failures"))
    places = []
    if len(c.world_sizes) == 1:
        places.append(f"world size {c.world_sizes[0]}")
    elif c.world_sizes:
        places.append("world sizes " + ",".join(str(n) for n in c.world_sizes))
    if c.meshes:
        places.append(("mesh " if len(c.meshes) == 1 else "meshes ") + " and ".join(c.meshes))
    where = "across " + (" and ".join(places) or "no world sizes")
    word = "INTERRUPTED" if result.interrupted else "OK" if result.ok else "FAIL"
    if paint is not None:
        word = paint(word, "pass" if result.ok else "fail")
    return f"ddpcheck: {', '.join(parts)} {where} -> {word} (exit {result.exit_code})"


def rank_summary(failures: Sequence[RankFailure]) -> str:
    """``rank 1 crashed; ranks 0, 2 aborted``: failures grouped by kind, kinds in first-seen order."""
    by_kind: dict[str, list[int]] = {}
    for failure in failures:
        by_kind.setdefault(failure.kind, []).append(failure.rank)
    parts = []
    for kind, ranks in by_kind.items():
        verb = FAILURE_VERB.get(kind, kind)
        noun = "rank" if len(ranks) == 1 else "ranks"
        listed = spans(ranks) if len(ranks) > MAX_LISTED else join_limited(ranks, str)  # 4096: "0-4095"
        parts.append(f"{noun} {listed} {verb}")
    return "; ".join(parts)


def same_failures(entries: Sequence[FailureEntry]) -> list[list[FailureEntry]]:
    """Rank failures with the same kind, message and cause, together (in first-seen order): 24 ranks
    failing one assert are one entry with its count, not 24 copies; 4096 are one, not 4096."""
    groups: dict[tuple[str, str, int | None], list[FailureEntry]] = {}
    for entry in entries:
        key = (entry.failure.kind, entry.failure.message, entry.cause)
        groups.setdefault(key, []).append(entry)
    return list(groups.values())


def failure_ranks(entries: Sequence[FailureEntry]) -> str:
    """``ws=2 rank 1``, ``ws=4 ranks 0-3``, ``ws=2, ws=3 rank 1``: where a failure was (layouts whose
    failing ranks are the same share one mention)."""
    by_where: dict[str, list[int]] = {}
    for entry in entries:
        by_where.setdefault(entry.where, []).append(entry.failure.rank)
    by_ranks: dict[str, list[str]] = {}
    for where, ranks in by_where.items():
        noun = "rank" if len(set(ranks)) == 1 else "ranks"
        by_ranks.setdefault(f"{noun} {spans(ranks)}", []).append(where)
    return "; ".join(f"{', '.join(wheres)} {ranks}" for ranks, wheres in by_ranks.items())


def join_limited(items: Iterable[object], fmt: Callable[[object], str], limit: int = MAX_LISTED) -> str:
    """``a, b, c ... (+N more)``: evidence lists stay one readable line however long they are."""
    items = list(items)
    text = ", ".join(fmt(item) for item in items[:limit])
    if len(items) > limit:
        text += f" ... (+{len(items) - limit} more)"
    return text


def format_example(example: object) -> str:
    """Ints as themselves (content hashes in their short form, as the checks' details write them),
    everything else as its repr (so strings and tuples keep their edges)."""
    if type(example) is int and abs(example) >= 10**15:
        return short_id(example)
    text = str(example) if type(example) is int else repr(example)
    if len(text) > MAX_EXAMPLE_CHARS:
        text = text[: MAX_EXAMPLE_CHARS - 3] + "..."
    return text


def evidence(verdict: Verdict, *, cause: bool = True) -> list[tuple[str, str]]:
    """The non-empty evidence fields of a failed verdict, as (label, text) pairs in report order.

    ``cause=False`` leaves the cause out (a report that lists causes once). Examples the detail sentence
    already quotes are not printed a second time.
    """
    examples = join_limited(verdict.examples, format_example)
    if examples and re.search(rf"(?<!\w)(?<!\d\.){re.escape(examples)}(?!\w)(?!\.\d)", verdict.detail):
        examples = ""
    rows = [
        ("cause", verdict.cause if cause else ""),
        ("ranks", join_limited(verdict.ranks, str)),
        ("epochs", join_limited(verdict.epochs, str)),
        ("e.g.", examples),
        ("logged", "; ".join(str(line) for line in _logged(verdict))),
    ]
    return [(label, text) for label, text in rows if text]


def _logged(verdict: Verdict) -> list[object]:
    """What the loader's library logged or warned where the check saw the failure (resume: restoring)."""
    log = verdict.evidence
    return list(log.logged) if isinstance(log, RestoreLog) else []


def trim_stack(stack: str, max_lines: int = STACK_LINES) -> list[str]:
    """The innermost ``max_lines`` lines of a stack, with a marker line saying how many were left out.

    Python tracebacks put the innermost frame last, so their tail is kept; faulthandler-style dumps
    ("most recent call first") put it first, so their head is kept.
    """
    lines = [line.rstrip() for line in stack.strip("\n").splitlines()]
    omitted = len(lines) - max_lines
    if omitted <= 0:
        return lines
    if "most recent call first" in stack:
        return [*lines[:max_lines], f"... ({omitted} later lines omitted)"]
    start = omitted
    for shift in range(4):  # begin at a frame ("  File ...") rather than in the middle of one
        if start + shift < len(lines) and lines[start + shift].lstrip().startswith("File "):
            start += shift
            break
    return [f"... ({start} earlier lines omitted)", *lines[start:]]


def fmt_number(value: float) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return str(value)


def fmt_diff(value: float) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value):
            return "nan"
        return "0" if value == 0 else f"{value:+.4g}"
    return str(value)


def divergence_cause(row: object) -> str:
    """``duplicated 3; dropped 1`` / ``order only``, then the row's own ``cause`` text if any."""
    effects = str(getattr(row, "effects", ""))
    cause = str(getattr(row, "cause", ""))
    parts = [effects] if effects else []
    if cause and cause not in parts:
        parts.append(cause)
    return "; ".join(parts) if parts else NOT_RUN


def resume_cells(row: ResumeRow) -> list[str]:
    """One restore as table cells (shared by the terminal, Markdown and HTML tables)."""
    first = NOT_RUN if row.first_divergence is None else str(row.first_divergence)
    outcome = row.outcome or row.status
    counts = [str(n) for n in (row.before, row.after, row.skipped, row.repeated)]
    return [row.topology, str(row.epoch), str(row.step), outcome, *counts, first]


@dataclass(frozen=True)
class TopologySummary:
    """Every restore of one topology change (``2 -> 1``, ``workers 2 -> 0``, ``dp=2,tp=2 -> dp=2``),
    over every layout that made one: how many ended each way, and the worst silent loss."""

    topology: str
    restores: int
    exact: int
    resharded: int
    refused: int
    failed: int
    worst: str  # "loses 24 and repeats 24 (epoch 0 step 6)"; "" when nothing was lost or repeated


def resume_summary(view: ReportView, only: Row | None = None) -> list[TopologySummary]:
    """The resume and elastic restores per topology change, in the order they first appear (of one
    layout's row where ``only`` names it)."""
    rows: dict[str, list[ResumeRow]] = {}
    for row in view.rows if only is None else (only,):
        for stop in row.run.resume:
            rows.setdefault(stop.topology, []).append(stop)
    out = []
    for topology, stops in rows.items():
        outcomes = Counter(restore_outcome(stop) for stop in stops)
        bad = [s for s in stops if restore_outcome(s) == "failed" and (s.skipped or s.repeated)]
        worst = ""
        if bad:
            top = max(bad, key=lambda s: (s.skipped + s.repeated, -s.epoch, -s.step))
            said = (
                f"loses {top.skipped}" if top.skipped else "",
                f"repeats {top.repeated}" if top.repeated else "",
            )
            worst = f"{' and '.join(w for w in said if w)} (epoch {top.epoch} step {top.step})"
        exact, resharded, refused, failed = (outcomes[k] for k in ("exact", "resharded", "refused", "failed"))
        out.append(TopologySummary(topology, len(stops), exact, resharded, refused, failed, worst))
    return out


def resume_caption(view: ReportView, row: Row) -> str:
    """What a layout's resume picture shows, per topology change: failed and refused counts, the worst
    loss (every report words it so)."""
    return f"Failed and refused restores, {row.label}: " + "; ".join(
        f"{summary.topology}: {summary.failed} failed, {summary.refused} refused"
        + (f", worst {summary.worst}" if summary.worst else "")
        for summary in resume_summary(view, row)
        if summary.failed or summary.refused
    )


def resume_notes(view: ReportView) -> list[tuple[str, int, tuple[str, ...]]]:
    """The notes of refused, failed and unjudged restores, identical ones once: (note, how many,
    topologies).
    A failure note that only restates its row's numbers ("not elastic: 2 -> 1 at ...") is left to the
    summary's worst loss."""
    found: dict[str, tuple[int, list[str]]] = {}
    for row in view.rows:
        for stop in row.run.resume:
            if restore_outcome(stop) not in ("refused", "failed", "skip") or not stop.note:
                continue
            if stop.note.startswith("not elastic: "):
                continue
            count, where = found.get(stop.note, (0, []))
            if stop.topology not in where:
                where.append(stop.topology)
            found[stop.note] = (count + 1, where)
    return [(note, count, tuple(where)) for note, (count, where) in found.items()]


def skip_reasons(result: CheckResult, status: str = "skip") -> list[Reason]:
    """Checks with ``status`` (skip or n/a) and why, identical (check, reason) merged across layouts."""
    with_backend = show_backend(result)
    merged: dict[tuple[str, str], list[WorldResult]] = {}
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.status == status and verdict.detail:
                runs = merged.setdefault((verdict.check, verdict.detail), [])
                if not any(seen is run for seen in runs):
                    runs.append(run)
    return [Reason(worlds_label(runs, with_backend), check, why) for (check, why), runs in merged.items()]


def worlds_label(runs: Sequence[WorldResult], with_backend: bool) -> str:
    """``ws=1,2,4`` (or ``ws=1 gloo, ws=2 nccl`` when backends differ; meshes by their spec); a script's
    loaders with the layouts they share: ``train.py:42, train.py:57 ws=2``."""
    if any(run.loader for run in runs):
        by_loader: dict[str, list[WorldResult]] = {}
        for run in runs:
            by_loader.setdefault(run.loader, []).append(run)
        shared: dict[str, list[str]] = {}
        for name, group in by_loader.items():
            plain = [replace(r, loader="") for r in group]
            shared.setdefault(worlds_label(plain, with_backend), []).append(name)
        return "; ".join(
            f"{', '.join(n for n in names if n)} {where}".strip() for where, names in shared.items()
        )
    if with_backend or any(r.layout is not None and r.layout.mesh for r in runs):
        plain = [r for r in runs if not (r.layout is not None and r.layout.mesh)]
        if with_backend or not plain:
            return ", ".join(world_label(run, with_backend) for run in runs)
        meshes = [world_label(r, False) for r in runs if r not in plain]
        return "; ".join(["ws=" + ",".join(str(r.world_size) for r in plain), *meshes])
    return "ws=" + ",".join(str(run.world_size) for run in runs)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


# ------------------------------------------------------------------ causes


def causes(result: CheckResult) -> list[Cause]:
    """Distinct causes in report order: failed checks, then rank failures, then allowed failures; each
    with what it explains, its fix and its findings."""
    with_backend = show_backend(result)
    found: dict[tuple[str, str], list[tuple[WorldResult, str]]] = {}
    verdicts: dict[tuple[str, str], list[tuple[WorldResult, Verdict]]] = {}
    listed_at: set[tuple[int, str, str, str]] = set()
    for kind in CAUSE_KINDS:
        for run in result.runs:
            for label, text, verdict in _cause_items(run, kind):
                where = found.setdefault((kind, text), [])
                if (id(run), label, kind, text) not in listed_at:  # each (layout, what) once
                    listed_at.add((id(run), label, kind, text))
                    where.append((run, label))
                if verdict is not None:
                    verdicts.setdefault((kind, text), []).append((run, verdict))
    out = []
    for number, ((kind, text), where) in enumerate(found.items(), start=1):
        listed = verdicts.get((kind, text), [])
        fix = next((v.fix for _, v in listed if v.fix), "")
        base = Cause(number, kind, text, tuple(where))
        out.append(
            Cause(
                number,
                kind,
                text,
                tuple(where),
                explains=explains(base, with_backend),
                fix=fix,
                findings=_findings(listed, with_backend),
            )
        )
    return out


def _cause_items(run: WorldResult, kind: str) -> list[tuple[str, str, Verdict | None]]:
    if kind == "rank":
        return [
            (f"rank {f.rank}", f"{FAILURE_VERB.get(f.kind, f.kind)}: {first_line(f.message)}", None)
            for f in run.failures
            if f.kind != "secondary"
        ]
    return [(v.check, v.cause or NO_CAUSE, v) for v in run.verdicts if v.status == kind]


def _findings(listed: Sequence[tuple[WorldResult, Verdict]], with_backend: bool) -> tuple[Finding, ...]:
    """One finding per check: the first layout's evidence, the other layouts named."""
    by_check: dict[str, list[tuple[WorldResult, Verdict]]] = {}
    for run, verdict in listed:
        by_check.setdefault(verdict.check, []).append((run, verdict))
    order = {check: i for i, check in enumerate(ALL_CHECKS)}
    out = []
    for check in sorted(by_check, key=lambda c: order.get(c, len(order))):
        (run, verdict), *others = by_check[check]
        out.append(
            Finding(
                check=check,
                status=verdict.status,
                where=world_label(run, with_backend),
                also=tuple(dict.fromkeys(world_label(r, with_backend) for r, _ in others)),
                detail=verdict.detail or "failed",
                evidence=tuple(evidence(verdict, cause=False)),
            )
        )
    return tuple(out)


def cause_number(found: Sequence[Cause], verdict: Verdict) -> int | None:
    """The number of the cause listed for a failed or allowed verdict."""
    text = verdict.cause or NO_CAUSE
    for cause in found:
        if cause.kind == verdict.status and cause.text == text:
            return cause.number
    return None


def explains(cause: Cause, with_backend: bool) -> str:
    """``coverage, no_overlap at ws=2,3; padding_bound at ws=3``: names sharing layouts merged."""
    runs_of: dict[str, list[WorldResult]] = {}
    ranks_of: dict[str, list[int]] = {}  # per layout label: the failed ranks, said as spans
    for run, name in cause.where:
        if name.startswith("rank ") and name[5:].isdigit():
            ranks_of.setdefault(worlds_label([run], with_backend), []).append(int(name[5:]))
            continue
        runs_of.setdefault(name, []).append(run)
    ranked = [f"{'rank' if len(r) == 1 else 'ranks'} {spans(r)} at {where}" for where, r in ranks_of.items()]
    order = {check: i for i, check in enumerate(ALL_CHECKS)}
    names = sorted(runs_of, key=lambda name: order.get(name, len(order)))
    merged: dict[str, list[str]] = {}
    for name in names:
        merged.setdefault(worlds_label(runs_of[name], with_backend), []).append(name)
    return "; ".join([*(f"{', '.join(group)} at {where}" for where, group in merged.items()), *ranked])
