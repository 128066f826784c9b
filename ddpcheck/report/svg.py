"""SVG pictures of one world size, drawn from :class:`~ddpcheck.figures.FigureData` alone.

Three pictures, each a standalone ``<svg>`` (valid XML: the Markdown report writes them as ``.svg``
files, the HTML report inlines them): which rank saw which sample (a strip per rank, plus rows that
light up missing and duplicated samples), steps per rank, and the sample-to-rank assignment across
epochs. No scripts, fonts or images: text uses the system's sans-serif font.

Strips are drawn in bin units (one unit per bin, scaled to the plot width) and consecutive bins of the
same shade merge into one sub-path, so a correct million-sample run draws in a few kilobytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from ddpcheck.figures import NO_RANK, SEVERAL, EpochFigure, FigureData
from ddpcheck.messages import spans
from ddpcheck.report.rows import restore_outcome
from ddpcheck.report.view import ReportView, as_view
from ddpcheck.restores import ResumeRow
from ddpcheck.result import CheckResult, WorldResult
from ddpcheck.verdict import (
    COVERAGE,
    EQUAL_STEPS,
    NO_OVERLAP,
    PADDING_BOUND,
    RESHUFFLE,
    SINGLE_PROCESS_EQUIVALENCE,
    WORK_BALANCE,
)

WIDTH = 960
LEFT = 96  # label column
RIGHT = 128  # count column
PLOT = WIDTH - LEFT - RIGHT
STRIP = 14
MARGIN = 8  # around the drawing, so a standalone .svg file does not clip its first letters
GAP = 4
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
MAX_STEP_ROWS = 64

RANK_COLORS = (
    "#4e79a7",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#9c755f",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#1f3b73",
    "#8c6d31",
)
MISSING = "#d62728"
DUPLICATED = "#ff7f0e"
SEVERAL_COLOR = "#3b3b3b"
EMPTY = "#eef0f3"
INK = "#1f2328"
MUTED = "#59636e"
STEP_OK = "#4e79a7"
STEP_ODD = "#d62728"
# Binned shares are drawn in four shades: some (< 42 %), about half, most, (nearly) all (> 90 %).
# The cuts sit away from 1/2, 1/3, 1/4, 2/3, 3/4 ..., the shares a W-rank split gives, so a random
# split does not flicker between two shades from column to column (which would also bloat the SVG).
SHADE_CUTS = (round(0.42 * 255), round(0.58 * 255), round(0.90 * 255))
SHADES = len(SHADE_CUTS) + 1
OPACITY = {1: "0.35", 2: "0.55", 3: "0.75"}


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


@dataclass(frozen=True)
class Picture:
    """One SVG picture: ``kind`` names it in file names and element classes."""

    kind: str  # "samples" | "steps" | "assignment"
    title: str
    svg: str


def _where(data: FigureData) -> str:
    return data.where or f"world size {data.world_size}"


def pictures(data: FigureData, failed: frozenset[str] = frozenset()) -> list[Picture]:
    """The pictures this data supports, in report order (none when there is nothing to draw).

    ``failed`` names the checks that failed at this layout: only what failed is drawn in alarm colours
    (a loader that drops its tail by design has missing samples, and a passing check says that is fine).
    """
    return list(_pictures(data, failed))


@functools.lru_cache(maxsize=32)
def _pictures(data: FigureData, failed: frozenset[str]) -> tuple[Picture, ...]:
    """Drawn once per layout, however many reports (HTML, Markdown, its .svg files) show them."""
    if not data.epochs:
        return ()
    noun = data.rank_noun
    out = [
        Picture("samples", f"Which {noun} saw which sample ({_where(data)})", samples_svg(data, failed)),
        Picture("steps", f"Steps per {noun} ({_where(data)})", steps_svg(data, failed)),
    ]
    if not any(f.samples for f in data.epochs):  # too large to picture sample by sample (the note says so)
        out = out[1:]
    if len(data.ranks) > 1 and data.owners:
        out.append(
            Picture(
                "assignment",
                f"Sample-to-{noun} assignment across epochs ({_where(data)})",
                assignment_svg(data, failed),
            )
        )
    if data.replicas:
        out.append(Picture("replicas", f"Replica groups step by step ({_where(data)})", replicas_svg(data)))
    if data.work and len(data.work) > 1:
        out.append(Picture("work", f"Work per {noun} and step ({_where(data)})", work_svg(data, failed)))
    return tuple(out)


def failed_checks(run: WorldResult) -> frozenset[str]:
    return frozenset(v.check for v in run.verdicts if v.failed)


def _svg(kind: str, height: int, label: str, body: Sequence[str]) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="ddp-figure {kind}" '
        f'viewBox="-{MARGIN} -{MARGIN} {WIDTH + 2 * MARGIN} {height + 2 * MARGIN}" '
        f'width="{WIDTH + 2 * MARGIN}" height="{height + 2 * MARGIN}" role="img" aria-label="{_attr(label)}" '
        f'font-family="{_attr(FONT)}" font-size="12" fill="{INK}">'
    )
    return "\n".join([head, f"<title>{_text(label)}</title>", *body, "</svg>"])


def _attr(text: str) -> str:
    return escape(_xml_safe(text), quote=True)


def _text(text: str) -> str:
    return escape(_xml_safe(text), quote=False)


def _xml_safe(text: str) -> str:
    return "".join(ch if ch in "\t\n" or (ch >= " " and ch not in "\ufffe\uffff") else "?" for ch in text)


def _label(
    x: float, y: float, text: str, *, anchor: str = "start", color: str = INK, bold: bool = False
) -> str:
    weight = ' font-weight="600"' if bold else ""
    fill = "" if color == INK else f' fill="{color}"'
    end = ' text-anchor="end"' if anchor == "end" else ""
    return f'<text x="{x:g}" y="{y:g}"{end}{fill}{weight}>{_text(text)}</text>'


def _runs(values: Sequence[int] | np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(start, length, value) of each run of equal values (found with numpy: a strip has thousands)."""
    array = np.asarray(values)
    if array.size == 0:
        return
    starts = np.flatnonzero(np.r_[True, array[1:] != array[:-1]])
    lengths = np.diff(np.r_[starts, array.size])
    yield from zip(starts.tolist(), lengths.tolist(), array[starts].tolist(), strict=True)


def _shades(shares: bytes) -> np.ndarray:
    """Stored shares (1..255) as shades 1..SHADES; 0 (nothing) stays 0."""
    levels = np.frombuffer(shares, dtype=np.uint8)
    shades = 1 + np.searchsorted(np.asarray(SHADE_CUTS), levels, side="left")
    return np.where(levels > 0, shades, 0)


def _strip(css: str, y: float, shares: bytes, color: str, tip: str, extra: str = "") -> str:
    """One row of bins: a pale background, then one path per shade with the bins of that shade."""
    bins = len(shares)
    paths: dict[int, list[str]] = {}
    for start, length, level in _runs(_shades(shares)):
        if level:
            paths.setdefault(level, []).append(f"M{start} 0h{length}v1h-{length}z")
    scale = PLOT / max(bins, 1)
    parts = [
        f'<g class="{css}"{extra} transform="translate({LEFT} {y:g}) scale({scale:.6g} {STRIP})">',
        f"<title>{_text(tip)}</title>",
        f'<rect width="{bins}" height="1" fill="{EMPTY}"/>',
    ]
    for level, commands in sorted(paths.items()):
        opacity = f' fill-opacity="{OPACITY[level]}"' if level in OPACITY else ""
        parts.append(f'<path d="{"".join(commands)}" fill="{color}"{opacity} shape-rendering="crispEdges"/>')
    parts.append("</g>")
    return "".join(parts)


def _axis_note(samples: int, bins: int) -> str:
    if bins < samples:
        per = samples / bins
        return (
            f"{samples:,} samples in {bins:,} columns of ~{per:,.0f}; shade: pale = some of a column, "
            "darker = about half, most, all"
        )
    return f"{samples:,} samples, one column each, in single-process order"


def samples_svg(data: FigureData, failed: frozenset[str] = frozenset()) -> str:
    """Per epoch: a strip per rank over the reference epoch's samples, then missing and duplicated."""
    body: list[str] = []
    y = 18
    body.append(
        _label(
            0,
            y,
            "Each strip is one rank; x = the single-process epoch's samples in the order it yields them.",
            color=MUTED,
        )
    )
    if data.note:
        y += 16
        body.append(_label(0, y, data.note, color=MUTED))
    for figure in data.epochs:
        y += 30
        body.append(_label(0, y, f"epoch {figure.epoch}", bold=True))
        body.append(_label(LEFT, y, _axis_note(figure.samples, figure.bins), color=MUTED))
        y += 10
        g = data.rank_group
        for i, shares in enumerate(figure.rank_share):
            members = data.strip_ranks(i)
            rank = members[0]
            yielded = sum(figure.yielded[i * g : i * g + len(members)])
            foreign = sum(figure.foreign[i * g : i * g + len(members)])
            seen = yielded - foreign
            who = f"{data.rank_noun} {rank}" if g == 1 else f"{data.rank_noun}s {rank}-{members[-1]}"
            tip = f"{who}: {'yields' if g == 1 else 'yield'} {yielded:,} samples in epoch {figure.epoch}"
            if foreign:
                tip += f" ({foreign:,} not in the single-process epoch)"
            extra = f' data-rank="{rank}" data-epoch="{figure.epoch}"'
            body.append(_label(LEFT - 8, y + 11, who, anchor="end"))
            body.append(_strip("strip", y, shares, rank_color(rank), tip, extra))
            body.append(_label(LEFT + PLOT + 8, y + 11, f"{seen:,} samples", color=MUTED))
            y += STRIP + GAP
        lost = bool(failed & {COVERAGE, SINGLE_PROCESS_EQUIVALENCE})
        repeated = bool(failed & {NO_OVERLAP, PADDING_BOUND})
        for css, name, shares, count, color, what, alarm in (
            ("missing", "missing", figure.missing, figure.missing_count, MISSING, "seen by no rank", lost),
            (
                "duplicated",
                "duplicated",
                figure.duplicated,
                figure.duplicated_count,
                DUPLICATED,
                "seen twice+",
                repeated,
            ),
        ):
            tip = f"{count:,} samples {what} in epoch {figure.epoch}"
            shown = color if count and alarm else MUTED
            body.append(_label(LEFT - 8, y + 11, name, anchor="end", color=shown))
            body.append(_strip(css, y, shares, color, tip, f' data-epoch="{figure.epoch}"'))
            body.append(_label(LEFT + PLOT + 8, y + 11, f"{count:,}", color=shown, bold=count > 0 and alarm))
            y += STRIP + GAP
        odd = [f"{data.rank_noun} {r}: {n:,}" for r, n in zip(data.ranks, figure.foreign, strict=False) if n]
        if odd:
            y += 12
            body.append(
                _label(LEFT, y, "not in the single-process epoch: " + ", ".join(odd[:8]), color=MISSING)
            )
    return _svg("samples", y + 14, f"Which {data.rank_noun} saw which sample, {_where(data)}", body)


def steps_svg(data: FigureData, failed: frozenset[str] = frozenset()) -> str:
    """Per epoch: one bar per rank (batches it yielded); when equal_steps failed, bars that differ from the
    most common are red."""
    body: list[str] = []
    most = max((max(f.steps, default=0) for f in data.epochs), default=0)
    most = max(most, *(f.reference_steps for f in data.epochs), 1)
    scale = PLOT / most
    y = 18
    body.append(
        _label(0, y, "Batches each rank yields; DDP needs the same number on every rank.", color=MUTED)
    )
    for figure in data.epochs:
        y += 30
        common = max(set(figure.steps), key=figure.steps.count) if figure.steps else 0
        said = sorted({n for n in figure.len_loader if n is not None})
        facts = [f"single process: {figure.reference_steps:,} batches"]
        if said:
            facts.append("len(loader): " + ", ".join(f"{n:,}" for n in said))
        body.append(_label(0, y, f"epoch {figure.epoch}", bold=True))
        body.append(_label(LEFT, y, "; ".join(facts), color=MUTED))
        y += 10
        rows = list(zip(data.ranks, figure.steps, figure.len_loader, strict=False))
        alike: list[int] = []  # past MAX_STEP_ROWS ranks: the ranks that differ drawn, the rest one line
        if len(rows) > MAX_STEP_ROWS:
            differ = [r for r in rows if r[1] != common or (r[2] is not None and r[2] != r[1])]
            alike = [r[0] for r in rows if r not in differ]
            rows = differ
        for rank, steps, length in rows[:MAX_STEP_ROWS]:
            odd = EQUAL_STEPS in failed and (steps != common or (length is not None and length != steps))
            color = STEP_ODD if odd else STEP_OK
            tip = f"{data.rank_noun} {rank}: {steps:,} batches" + (
                f", len(loader) = {length:,}" if length is not None else ""
            )
            body.append(_label(LEFT - 8, y + 11, f"{data.rank_noun} {rank}", anchor="end"))
            body.append(
                f'<g class="steps-bar" data-rank="{rank}" data-epoch="{figure.epoch}" data-steps="{steps}">'
                f"<title>{_text(tip)}</title>"
                f'<rect x="{LEFT}" y="{y}" width="{PLOT}" height="{STRIP}" fill="{EMPTY}"/>'
                f'<rect x="{LEFT}" y="{y}" width="{steps * scale:.1f}" height="{STRIP}" fill="{color}"/></g>'
            )
            if length is not None and length != steps:
                x = LEFT + length * scale
                body.append(
                    f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - 2}" y2="{y + STRIP + 2}" stroke="{INK}" '
                    'stroke-dasharray="3 2"/>'
                )
            text = f"{steps:,}" + ("" if length is None or length == steps else f" (len {length:,})")
            body.append(_label(LEFT + PLOT + 8, y + 11, text, color=STEP_ODD if odd else MUTED, bold=odd))
            y += STRIP + GAP
        if len(rows) > MAX_STEP_ROWS:
            rest = [s for _, s, _ in rows[MAX_STEP_ROWS:]]
            y += 12
            body.append(
                _label(
                    LEFT,
                    y,
                    f"... {len(rest)} more ranks that differ: {min(rest):,} to {max(rest):,} batches",
                    color=MUTED,
                )
            )
        if alike:
            y += 12
            noun = f"{data.rank_noun}s" if len(alike) > 1 else data.rank_noun
            other = "other " if rows else ""
            line = f"{len(alike):,} {other}{noun} ({spans(alike, 4)}): {common:,} batches each"
            body.append(_label(LEFT, y, line, color=MUTED))
    return _svg("steps", y + 14, f"Steps per {data.rank_noun}, {_where(data)}", body)


def assignment_svg(data: FigureData, failed: frozenset[str] = frozenset()) -> str:
    """One row per epoch over epoch 0's samples, coloured by the rank that saw each sample.

    Identical rows mean the same samples go to the same ranks every epoch: no reshuffle.
    """
    body: list[str] = []
    y = 18
    intro = "Which rank gets each sample, epoch by epoch; identical rows = no reshuffle."
    body.append(_label(0, y, intro, color=MUTED))
    y += 16
    moved = "moved = share of all samples on one rank in both epochs whose rank changed since the last epoch"
    body.append(_label(0, y, moved, color=MUTED))
    y += 16
    if data.owner_bins < data.owner_samples:
        note = (
            f"x = a fixed random {data.owner_bins:,} of epoch 0's {data.owner_samples:,} samples, "
            "one column each, in single-process order"
        )
    else:
        note = "x = epoch 0's samples; " + _axis_note(data.owner_samples, data.owner_bins)
    body.append(_label(0, y, note, color=MUTED))
    y += 14
    for epoch, owners in enumerate(data.owners):
        body.append(_label(LEFT - 8, y + 11, f"epoch {epoch}", anchor="end"))
        body.append(_owner_row(y, epoch, owners))
        if epoch:
            share = data.changed[epoch - 1] if epoch - 1 < len(data.changed) else None
            text = "moved: -" if share is None else f"moved: {share:.0%}"
            alarm = share == 0 and RESHUFFLE in failed
            body.append(_label(LEFT + PLOT + 8, y + 11, text, color=MISSING if alarm else MUTED, bold=alarm))
        y += STRIP + GAP
    y += 14
    x = LEFT
    legend = [(f"{data.rank_noun} {r}", rank_color(r)) for r in data.ranks[: min(len(data.ranks), 10)]]
    legend += [("several ranks", SEVERAL_COLOR), ("no rank", MISSING)]
    for name, color in legend:
        body.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{color}"/>')
        body.append(_label(x + 14, y, name, color=MUTED))
        x += 24 + 7 * len(name)
    return _svg("assignment", y + 12, f"Sample-to-{data.rank_noun} assignment, {_where(data)}", body)


AGREE = "#59a14f"


WORK_LEVELS = 8


def work_svg(data: FigureData, failed: frozenset[str] = frozenset()) -> str:
    """A heat strip per rank over epoch 0's steps (darker: more work in that step), and each rank's epoch
    total as a bar: a rank that is dark where the others are pale waits for no one, the others wait."""
    body: list[str] = []
    y = 18
    per = f"{data.work_per_column:,} steps per column; " if data.work_per_column > 1 else ""
    intro = f"Work in epoch 0 ({data.work_source}); {per}darker = more work in that step (vs the busiest)."
    body.append(_label(0, y, intro, color=MUTED))
    y += 14
    work = [[_finite(v) for v in row] for row in data.work]
    totals = [_finite(t) for t in data.work_totals]
    top = max((max(row, default=0.0) for row in work), default=0.0) or 1.0
    most = max(totals, default=0.0) or 1.0
    heavy = WORK_BALANCE in failed
    for rank, row, total in zip(data.ranks, work, totals, strict=False):
        levels = [0 if v <= 0 else 1 + min(WORK_LEVELS - 1, int(v / top * WORK_LEVELS)) for v in row]
        scale = PLOT / max(len(row), 1)
        paths: dict[int, list[str]] = {}
        for start, length, level in _runs(levels):
            if level:
                paths.setdefault(level, []).append(f"M{start} 0h{length}v1h-{length}z")
        color = STEP_OK  # one scale for every rank: the strips compare
        body.append(_label(LEFT - 8, y + 11, f"{data.rank_noun} {rank}", anchor="end"))
        parts = [
            f'<g class="work-strip" data-rank="{rank}" data-total="{total:g}" '
            f'transform="translate({LEFT} {y}) scale({scale:.6g} {STRIP})">',
            f"<title>{_text(f'{data.rank_noun} {rank}: {total:,.0f} in epoch 0')}</title>",
            f'<rect width="{len(row)}" height="1" fill="{EMPTY}"/>',
        ]
        for level, commands in sorted(paths.items()):
            parts.append(
                f'<path d="{"".join(commands)}" fill="{color}" fill-opacity="{level / WORK_LEVELS:.3f}" '
                'shape-rendering="crispEdges"/>'
            )
        parts.append("</g>")
        body.append("".join(parts))
        share = total / most
        bar = STEP_ODD if heavy and share == 1.0 else MUTED
        body.append(
            f'<rect x="{LEFT + PLOT + 8}" y="{y + 3}" width="{share * (RIGHT - 56):.1f}" '
            f'height="{STRIP - 6}" fill="{bar}"/>'
        )
        body.append(_label(WIDTH - 4, y + 11, f"{total:,.0f}", anchor="end", color=MUTED))
        y += STRIP + GAP
    return _svg("work", y + 14, f"Work per {data.rank_noun} and step, {_where(data)}", body)


def _finite(value: float) -> float:
    """Work drawn as 0 where it is not a finite number >= 0: a picture must never raise (``int(nan)``);
    the rank side refuses such hook values before they get here."""
    return value if math.isfinite(value) and value > 0 else 0.0


def replicas_svg(data: FigureData) -> str:
    """One bar per replica group over its first epoch's steps: green while its replicas receive the same
    batches, red from the step where one first differs (and a note of how)."""
    body: list[str] = []
    y = 18
    intro = "Each bar is one replica group (the ranks sharing a data-parallel rank), over epoch 0's steps."
    body.append(_label(0, y, intro, color=MUTED))
    y += 16
    body.append(
        _label(
            0,
            y,
            "green: its replicas receive the same batches; red: from where they first differ.",
            color=MUTED,
        )
    )
    y += 14
    most = max((g.steps for g in data.replicas), default=1) or 1
    scale = PLOT / most
    for group in data.replicas:
        differs = group.epoch is not None
        at = group.step if differs and group.epoch == 0 and group.step is not None else group.steps
        body.append(_label(LEFT - 8, y + 11, group.where, anchor="end"))
        flag = str(differs).lower()
        body.append(
            f'<g class="replica-group" data-where="{_attr(group.where)}" data-differs="{flag}">'
            f'<rect x="{LEFT}" y="{y}" width="{PLOT}" height="{STRIP}" fill="{EMPTY}"/>'
            f'<rect x="{LEFT}" y="{y}" width="{at * scale:.1f}" height="{STRIP}" fill="{AGREE}"/>'
            + (
                f'<rect x="{LEFT + at * scale:.1f}" y="{y}" width="{(group.steps - at) * scale:.1f}" '
                f'height="{STRIP}" fill="{MISSING}"/>'
                if differs
                else ""
            )
            + "</g>"
        )
        where = f"e{group.epoch} " if group.epoch else ""
        text = f"{where}step {group.step}: {group.kind}" if differs else "in step"
        body.append(_label(LEFT + PLOT + 8, y + 11, text, color=MISSING if differs else MUTED, bold=differs))
        y += STRIP + GAP
    return _svg("replicas", y + 14, f"Replica groups, {_where(data)}", body)


def _owner_row(y: float, epoch: int, owners: Sequence[int]) -> str:
    bins = len(owners)
    paths: dict[int, list[str]] = {}
    for start, length, owner in _runs(owners):
        paths.setdefault(owner, []).append(f"M{start} 0h{length}v1h-{length}z")
    scale = PLOT / max(bins, 1)
    where = f"translate({LEFT} {y:g}) scale({scale:.6g} {STRIP})"
    parts = [
        f'<g class="owners" data-epoch="{epoch}" transform="{where}">',
        f'<rect width="{bins}" height="1" fill="{EMPTY}"/>',
    ]
    for owner, commands in sorted(paths.items()):
        color = MISSING if owner == NO_RANK else SEVERAL_COLOR if owner == SEVERAL else rank_color(owner)
        parts.append(f'<path d="{"".join(commands)}" fill="{color}" shape-rendering="crispEdges"/>')
    parts.append("</g>")
    return "".join(parts)


def epoch_summary(figure: EpochFigure) -> str:
    """One line of numbers under a picture, for readers of the text (and screen readers)."""
    parts = [f"{figure.samples:,} samples"]
    parts.append(f"{figure.missing_count:,} missing")
    parts.append(f"{figure.duplicated_count:,} duplicated ({figure.extra_copies:,} extra copies)")
    return f"epoch {figure.epoch}: " + ", ".join(parts)


@dataclass(frozen=True)
class PictureFile:
    """A picture as a file next to the Markdown report: ``<stem>-ws2-samples.svg``."""

    name: str
    run: WorldResult
    picture: Picture


def picture_files(result: CheckResult | ReportView, stem: str) -> list[PictureFile]:
    """Every picture of ``result`` with the file name the Markdown report links it by: each layout's
    figures, then its failed and refused restores (kind ``resume``)."""
    out = []
    for row in as_view(result).rows:
        drawn = pictures(row.run.figures, failed_checks(row.run)) if row.run.figures is not None else []
        if row.bad_restores:
            title = f"Failed and refused restores, {row.label}"
            drawn.append(Picture(RESUME_PICTURE, title, resume_svg(row.bad_restores, row.label)))
        for picture in drawn:
            out.append(PictureFile(f"{stem}-{row.anchor}-{picture.kind}.svg", row.run, picture))
    return out


def mixture_svg(
    sources: Sequence[str], groups: Sequence[tuple[str, int, Sequence[float]]], where: str
) -> str:
    """One stacked bar per group (expected, single process, all ranks, each rank and worker): each source's
    share as a segment in its colour, the expected shares as ticks on every bar, a legend below."""
    body: list[str] = []
    y = 18
    body.append(
        _label(
            0, y, "Share of each source (summed over the epochs); ticks: the expected shares.", color=MUTED
        )
    )
    y += 14
    expected = next((shares for who, _, shares in groups if who == "expected"), None)
    ticks = []
    at = 0.0
    for share in expected or ():
        at += share if math.isfinite(share) else 0.0
        ticks.append(at)
    for who, n, shares in groups:
        body.append(_label(LEFT - 8, y + 11, who, anchor="end"))
        x = float(LEFT)
        for i, share in enumerate(shares):
            width = PLOT * share if math.isfinite(share) and share > 0 else 0.0
            if width > 0:
                tip = f"{who}: {sources[i]} {share:.1%}"
                body.append(
                    f'<rect class="mixture-share" data-source="{_attr(sources[i])}" x="{x:.2f}" y="{y}" '
                    f'width="{width:.2f}" height="{STRIP}" fill="{rank_color(i)}">'
                    f"<title>{_text(tip)}</title></rect>"
                )
            x += width
        for tick in ticks[:-1]:
            tx = LEFT + PLOT * tick
            body.append(
                f'<line x1="{tx:.2f}" y1="{y - 2}" x2="{tx:.2f}" y2="{y + STRIP + 2}" stroke="{INK}"/>'
            )
        if n:
            body.append(_label(WIDTH - 4, y + 11, f"{n:,}", anchor="end", color=MUTED))
        y += STRIP + GAP
    x = float(LEFT)
    y += 12
    for i, name in enumerate(sources):
        body.append(f'<rect x="{x:.1f}" y="{y - 10}" width="10" height="10" fill="{rank_color(i)}"/>')
        body.append(_label(x + 14, y, name))
        x += 24 + 7 * len(name)
    return _svg("mixture", y + 12, f"Mixture shares, {where}", body)


REFUSED = "#8c959f"  # neutral: a restore that raised a clear error is an honest answer, not a loss
BEFORE = "#4e79a7"
AFTER = "#a0cbe8"
MAX_RESTORE_ROWS = 24  # bars in one picture (a restore's per-rank bars count one each)
RESUME_PICTURE = "resume"  # the kind of a layout's picture of its failed and refused restores
MAX_RANK_BARS = 8  # per restore: the ranks that lost or repeated first, then the others in rank order


@dataclass(frozen=True)
class _Bar:
    """One bar of the resume picture: a rank's part of a restore, or the whole restore."""

    label: str
    tip: str  # the restore's name and who, for hover texts
    before: int
    lost: int
    after: int
    repeated: int


def resume_bars(row: ResumeRow) -> tuple[list[_Bar], int]:
    """A failed restore's bars, one per rank (the ranks that lost or repeated first, at most
    :data:`MAX_RANK_BARS`), or one for the whole restore where the row has no per-rank counts; and how
    many ranks were left out."""
    name = f"{row.topology} e{row.epoch} s{row.step}"
    if not row.ranks:
        return [_Bar(name if len(name) <= 16 else name[:15] + "…", name, row.before, row.skipped, row.after,
                     row.repeated)], 0  # fmt: skip
    damaged = [r for r in row.ranks if r.lost or r.repeated]
    shown = sorted(
        [*damaged, *(r for r in row.ranks if r not in damaged)][:MAX_RANK_BARS], key=lambda r: r.rank
    )
    bars = [
        _Bar(f"rank {r.rank}", f"{name}, rank {r.rank}", r.before, r.lost, r.after, r.repeated) for r in shown
    ]
    return bars, len(row.ranks) - len(shown)


def _bar(bar: _Bar, y: float, scale: float) -> list[str]:
    """before | lost | after on one scale, the repeats marked on the after part's head."""
    out = [_label(LEFT - 8, y + 11, bar.label, anchor="end")]
    x = float(LEFT)
    for css, n, color in (
        ("before", bar.before, BEFORE),
        ("lost", bar.lost, MISSING),
        ("after", bar.after, AFTER),
    ):
        width = PLOT * n / scale
        if width > 0:
            out.append(
                f'<rect class="{css}" x="{x:.2f}" y="{y}" width="{max(width, 1.5):.2f}" height="{STRIP}" '
                f'fill="{color}"><title>{_text(f"{bar.tip}: {n:,} {css}")}</title></rect>'
            )
        x += width
    if bar.repeated:  # samples trained again after the restore: the after bar's head
        start = LEFT + PLOT * (bar.before + bar.lost) / scale
        width = max(PLOT * min(bar.repeated, max(bar.after, bar.repeated)) / scale, 1.5)
        out.append(
            f'<rect class="repeated" x="{start:.2f}" y="{y + STRIP / 2:g}" width="{width:.2f}" '
            f'height="{STRIP / 2:g}" fill="{DUPLICATED}">'
            f"<title>{_text(f'{bar.tip}: {bar.repeated:,} repeated')}</title></rect>"
        )
    said = [f"lost {bar.lost:,}" if bar.lost else "", f"rep. {bar.repeated:,}" if bar.repeated else ""]
    out.append(
        _label(WIDTH - 4, y + 11, ", ".join(w for w in said if w) or "exact", anchor="end", color=MISSING)
    )
    return out


def resume_svg(rows: Sequence[ResumeRow], where: str) -> str:
    """Per failed restore one bar per rank (the samples it trained before the stop, what the restore lost
    in red, repeated in orange, and after it), headed by the restore; a refused restore as one grey bar
    (it raised: nothing lost silently). Bars share one scale, so the worst loss stands out."""
    planned = [(row, resume_bars(row) if restore_outcome(row) != "refused" else ([], 0)) for row in rows]
    scale = max((b.before + b.lost + b.after for _, (bars, _) in planned for b in bars), default=0) or 1
    body = [_label(0, 14, "Per restore and rank: trained before the stop | lost | after the restore (repeats "
                   "marked)", color=MUTED)]  # fmt: skip
    y, drawn, left_out = 26, 0, 0
    for row, (bars, hidden) in planned:
        outcome = restore_outcome(row)
        if drawn + max(len(bars), 1) > MAX_RESTORE_ROWS:
            left_out += 1
            continue
        name = f"{row.topology} e{row.epoch} s{row.step}"
        body.append(f'<g class="restore {_attr(outcome)}" data-topology="{_attr(row.topology)}">')
        if outcome == "refused":
            note = f"refused: {row.note}" if row.note else "refused"
            body.append(_label(LEFT - 8, y + 11, name if len(name) <= 16 else name[:15] + "…", anchor="end"))
            body.append(
                f'<rect class="refused" x="{LEFT}" y="{y}" width="{PLOT:g}" height="{STRIP}" '
                f'fill="{REFUSED}" fill-opacity="0.35"><title>{_text(name + ": " + note)}</title></rect>'
            )
            body.append(_label(WIDTH - 4, y + 11, "refused", anchor="end", color=MUTED))
            y += STRIP + GAP
        else:
            if row.ranks:  # the restore heads its ranks' bars
                head = f"{name}: lost {row.skipped:,}, repeated {row.repeated:,}"
                more = f" ({hidden} more ranks not drawn)" if hidden else ""
                body.append(_label(LEFT, y + 11, head + more, bold=True))
                y += STRIP + GAP
            for bar in bars:
                body += _bar(bar, y, scale)
                y += STRIP + GAP
        body.append("</g>")
        drawn += max(len(bars), 1)
    if left_out:
        y += 10
        body.append(_label(LEFT, y, f"... and {left_out} more restores (the table below)", color=MUTED))
    y += 16
    x = float(LEFT)
    for name, color in (("before", BEFORE), ("lost", MISSING), ("repeated", DUPLICATED), ("after", AFTER),
                        ("refused", REFUSED)):  # fmt: skip
        body.append(f'<rect x="{x:.1f}" y="{y - 10}" width="10" height="10" fill="{color}"/>')
        body.append(_label(x + 14, y, name))
        x += 24 + 7 * len(name)
    return _svg("resume", y + 8, f"Failed and refused restores, {where}", body)
