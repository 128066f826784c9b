"""JUnit XML for CI: one testcase per (world size, check), so CI lists exactly what failed where.

The file validates against the Surefire/Jenkins ``junit-10.xsd`` that pytest tests its own output
with. Layout: ``<testsuites name tests failures errors time>`` (that schema has no ``skipped`` there)
around one ``<testsuite name tests failures errors skipped time>``: its properties, a
``<system-out>`` listing each distinct cause once, then per world size one ``<testcase
classname="ddpcheck.ws{N}" name="{check_id}">`` per verdict (a mesh's classname is its spec,
``ddpcheck.dp=2,tp=2``). A failed check has a ``<failure>``;
``skip``, ``n/a`` and ``allowed`` have a ``<skipped type=STATUS>`` (CI shows them, none fails the
build; an allowed one keeps its failure text). A world size that was not run is a ``world_size`` case
with ``<skipped>``; crashed, hung or killed ranks are one ``ranks`` case with a ``<failure
type="rank-failure">`` (the schema has no ``<error>`` element; ``type`` tells them apart). A world
size's wall time is spread evenly over its testcases, so the suite time adds up.

Built with ElementTree (which escapes ``<&>"``); characters XML 1.0 cannot hold at all (NUL, the
ESC of ANSI colour codes in a captured stack, lone surrogates) are written as ``\\xNN`` / ``\\uNNNN``
so the file always parses.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from ddpcheck.report.view import ReportView, as_view, evidence, rank_summary
from ddpcheck.result import CheckResult, WorldResult

_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 forbids replaced by a visible escape."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _ILLEGAL.sub(escape, str(text))


def render_junit(result: CheckResult | ReportView, *, suite_name: str = "ddpcheck") -> str:
    """The JUnit XML document as text, with an XML declaration."""
    view = as_view(result)
    result = view.result
    suite = ET.Element("testsuite", name=xml_text(suite_name))
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("loader", result.loader),
        ("id_source", result.id_source),
        ("epochs", str(result.epochs)),
        ("exit_code", str(result.exit_code)),
    ):
        ET.SubElement(properties, "property", name=name, value=xml_text(value))
    if view.causes:
        lines = ["Causes:"]
        for cause in view.causes:
            marker = " (allowed)" if cause.kind == "allowed" else ""
            lines.append(f"[{cause.number}]{marker} {cause.text}")
            lines.append(f"    explains: {cause.explains}")
            if cause.fix:
                lines.append(f"    fix: {cause.fix}")
        ET.SubElement(suite, "system-out").text = xml_text("\n".join(lines))

    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    seconds = 0.0
    order = view.columns
    for row in view.rows:
        run = row.run
        where = run.layout.spec if run.layout is not None and run.layout.mesh else f"ws{run.world_size}"
        classname = f"{suite_name}.{where}" + (f".{run.backend}" if view.with_backend else "")
        cases = _cases(run, order)
        share = _seconds(run.seconds) / max(len(cases), 1)
        seconds += _seconds(run.seconds)
        for name, outcome, attrs, text in cases:
            case = ET.SubElement(
                suite, "testcase", classname=xml_text(classname), name=xml_text(name), time=f"{share:.3f}"
            )
            totals["tests"] += 1
            if outcome is None:
                continue
            totals[{"failure": "failures", "error": "errors", "skipped": "skipped"}[outcome]] += 1
            element = ET.SubElement(case, outcome, {k: xml_text(v) for k, v in attrs.items()})
            if text:
                element.text = xml_text(text)
    if result.interrupted:  # the world sizes never checked must not read as green
        case = ET.SubElement(
            suite, "testcase", classname=xml_text(suite_name), name="interrupted", time="0.000"
        )
        message = "interrupted (Ctrl-C or SIGTERM): world sizes after the last one shown were not checked"
        ET.SubElement(case, "error", message=message, type="interrupted")
        totals["tests"] += 1
        totals["errors"] += 1
    if result.notes:
        ET.SubElement(suite, "system-out").text = xml_text("Notes:\n" + "\n".join(result.notes))

    counts = {key: str(value) for key, value in totals.items()}
    counts["time"] = f"{seconds:.3f}"
    suite.attrib.update(counts)
    outer = {key: value for key, value in counts.items() if key != "skipped"}
    root = ET.Element("testsuites", {"name": xml_text(suite_name), **outer})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


Case = tuple[str, str | None, dict[str, str], str]


def _seconds(value: float) -> float:
    return value if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0


def _cases(run: WorldResult, order: tuple[str, ...]) -> list[Case]:
    """(name, outcome element or None, its attributes, its text) for each testcase of one world size."""
    cases: list[Case] = []
    if run.skipped:
        cases.append(("world_size", "skipped", {"message": run.skipped}, ""))
    verdicts = sorted(run.verdicts, key=lambda v: order.index(v.check) if v.check in order else len(order))
    for verdict in verdicts:
        text = "\n".join(f"{name}: {value}" for name, value in evidence(verdict))
        if verdict.status == "fail":
            message = verdict.detail or f"{verdict.check} failed"
            cases.append((verdict.check, "failure", {"message": message, "type": verdict.check}, text))
        elif verdict.status == "pass":
            cases.append((verdict.check, None, {}, ""))
        elif verdict.status == "allowed":
            message = f"allowed by --allow {verdict.check}: {verdict.detail or 'failed'}"
            cases.append((verdict.check, "skipped", {"message": message, "type": "allowed"}, text))
        elif verdict.status == "n/a":
            message = f"not applicable: {verdict.detail}" if verdict.detail else "not applicable"
            cases.append((verdict.check, "skipped", {"message": message, "type": "n/a"}, ""))
        else:  # "skip" (an unknown status is counted as a skip everywhere)
            cases.append((verdict.check, "skipped", {"message": verdict.detail, "type": "skip"}, ""))
    if run.failures:
        blocks = []
        for failure in run.failures:
            lines = [f"rank {failure.rank} {failure.kind}: {failure.message}"]
            if failure.progress:
                lines.append(f"progress: {failure.progress}")
            if failure.stack.strip():
                lines.append(failure.stack.rstrip())
            if failure.output.strip():
                lines += ["its last output lines:", failure.output.rstrip()]
            blocks.append("\n".join(lines))
        message = rank_summary(run.failures)
        cases.append(("ranks", "failure", {"message": message, "type": "rank-failure"}, "\n\n".join(blocks)))
    return cases
