"""The machine-readable report: a CheckResult as versioned, always-valid JSON.

Schema (``SCHEMA_VERSION = 3``); every key is always present::

    {
      "schema": 3,
      "ok": bool,                    # CheckResult.ok
      "exit_code": int,              # 0 ok, 1 a check failed, 2 bad input, 3 a rank failed, 130 interrupted
      "interrupted": bool,           # Ctrl-C or SIGTERM: world sizes after the last run were not checked
      "loader": str,
      "id_source": str,              # "index" | "hook" | "field:<name>" | "content-hash"
      "epochs": int,
      "options": {...},              # the run's options, made JSON-safe (see below)
      "notes": [str, ...],
      "summary": {"passed": int, "failed": int, "not_applicable": int, "allowed": int,
                  "skipped": int, "rank_failures": int,
                  "world_sizes": [int, ...],     # the plain world sizes checked
                  "meshes": [str, ...]},         # the meshes checked; same counts as the summary line
      "causes": [{                   # each distinct cause once, in report order (numbers as shown)
        "number": int,
        "kind": "fail" | "rank" | "allowed",   # failed checks, rank failures, allowed failures
        "cause": str,                # "cause not identified" when a check named none
        "explains": str,             # "coverage, no_overlap at ws=2,3"
        "fix": str,                  # how to fix it, "" when no check named a fix
        "where": [{"world_size": int, "label": str, "backend": str, "what": str}]  # a check id or "rank N"
      }],
      "runs": [{                     # one per layout: a world size or a device mesh
        "world_size": int,           # every rank of the layout
        "label": str,                # "ws=2", or the mesh spec "dp=2,tp=2" (a script's: "train.py:42 ws=2")
        "loader": str,               # a training script's loader ("train.py:42"); "" for a loader file
        "mesh": null | {"names": [str, ...], "shape": [int, ...], "data_dims": [str, ...]},
        "backend": str,
        "ok": bool,                  # WorldResult.ok
        "skipped": str,              # "" when it ran, else why it was not run
        "seconds": float,
        "padding": str,              # "4 padding copies of 64 samples (6%)", "none", "" when not judged
        "idle": str,                 # "14%, 12% (random batching: 16%, 17%)", "" when work was not measured
        "checks": {                  # in report column order; a repeated id gets "#2", "#3" ...
          CHECK_ID: {"status": "pass" | "fail" | "skip" | "n/a" | "allowed", "detail": str,
                     "cause": str, "fix": str, "ranks": [int, ...], "epochs": [int, ...], "examples": [...],
                     "data": {...}}
        },
        "failures": [{"rank": int, "kind": str, "message": str, "stack": str, "progress": str,
                      "output": str}],         # output: a script rank's last printed lines; a stack
                                               # equal to an earlier rank's: "(the same stack as rank N)"
        "divergence": [{"metric": str, "reference": float, "naive": float, "corrected": float,
                        "naive_diff": float, "corrected_diff": float, "duplicated": int,
                        "dropped": int, "order_only": bool, "cause": str}],
        "resume": [{"world_size_from": int, "world_size_to": int,
                    "change": str,       # "2 -> 3", "workers 2 -> 0", "dp=2,tp=2 -> dp=4"
                    "outcome": str,      # "exact" | "resharded" | "refused" | "failed" (else the status)
                    "epoch": int, "step": int, "status": str,
                    "before": int, "after": int,   # samples trained before the stop / after the restore
                    "skipped": int, "repeated": int,
                    "first_divergence": int | null, "note": str,
                    "ranks": [{"rank": int, "before": int, "after": int,   # every rank's part ([]: not
                               "lost": int, "repeated": int}]}]            # known); see RankRestore
      }],
      "mixture": [{                  # per layout whose batches carry a source (sample_source / "source")
        "label": str, "status": str, "sources": [str, ...],
        "expected_from": "source_weights()" | "single-process run",
        "groups": [{"who": str,      # "expected", "single process", "all ranks", "rank 0", "rank 0 worker 1"
                    "samples": int, "shares": [float, ...]}]   # summed over the epochs, one per source
      }]
    }

``skip``: could not be judged; ``n/a``: does not apply to this loader; ``allowed``: failed, and the
user allowed it with ``--allow`` (it does not fail the run). The pictures of the HTML report are not
part of the JSON.

JSON-safety: tuples and lists become lists, sets become lists sorted by repr, dict keys become
strings, numpy/torch scalars and arrays their ``tolist()``, paths ``os.fspath``, anything else its
``repr``. Non-finite floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (which
both Python's ``float()`` and JavaScript's ``Number()`` read back), so the output is strict JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from ddpcheck.report.mixture_view import MixtureTable
from ddpcheck.report.rows import Row
from ddpcheck.report.view import Cause, ReportView, as_view
from ddpcheck.restores import ResumeRow
from ddpcheck.result import CheckResult, MetricRow
from ddpcheck.trace import RankFailure
from ddpcheck.verdict import Verdict

SCHEMA_VERSION = 3  # 2: layouts (label, mesh), padding, each cause's fix; 3: resume topology/outcome, idle
_MAX_DEPTH = 32  # deeper (or cyclic) structures end in their repr instead of a RecursionError


def jsonable(obj: object, _depth: int = 0) -> Any:
    """``obj`` as plain JSON data that ``json.dumps(..., allow_nan=False)`` always accepts."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if math.isfinite(obj):
            return float(obj)
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if _depth >= _MAX_DEPTH:
        return repr(obj)
    if isinstance(obj, dict):
        return {_key(k): jsonable(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, _depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [jsonable(v, _depth + 1) for v in sorted(obj, key=repr)]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and not isinstance(obj, type):
        try:
            return jsonable(tolist(), _depth + 1)
        except Exception:
            pass
    return repr(obj)


def _key(key: object) -> str:
    return key if isinstance(key, str) else repr(key)


def to_json_dict(result: CheckResult | ReportView) -> dict[str, Any]:
    """The documented schema as a dict of plain JSON data."""
    view = as_view(result)
    res, counts = view.result, view.counts
    return {
        "schema": SCHEMA_VERSION,
        "ok": res.ok,
        "exit_code": res.exit_code,
        "interrupted": res.interrupted,
        "loader": res.loader,
        "id_source": res.id_source,
        "epochs": res.epochs,
        "options": jsonable(res.options.as_data()),
        "notes": [str(note) for note in res.notes],
        "summary": {
            "passed": counts.passed,
            "failed": counts.failed,
            "not_applicable": counts.not_applicable,
            "allowed": counts.allowed,
            "skipped": counts.skipped,
            "rank_failures": counts.rank_failures,
            "world_sizes": list(counts.world_sizes),
            "meshes": list(counts.meshes),
        },
        "causes": [_cause(cause) for cause in view.causes],
        "runs": [_run(row, view.columns) for row in view.rows],
        "mixture": [_mixture(table) for table in view.mixtures],
    }


def render_json(result: CheckResult | ReportView, *, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN/Infinity literals), keys in schema order."""
    return json.dumps(to_json_dict(result), indent=indent, ensure_ascii=False, allow_nan=False)


def _run(row: Row, order: tuple[str, ...]) -> dict[str, Any]:
    run = row.run
    checks: dict[str, Any] = {}
    ranked = sorted(run.verdicts, key=lambda v: order.index(v.check) if v.check in order else len(order))
    for verdict in ranked:
        name, n = verdict.check, 1
        while name in checks:
            n += 1
            name = f"{verdict.check}#{n}"
        checks[name] = _verdict(verdict)
    layout = run.layout
    mesh = None
    if layout is not None and layout.mesh:
        mesh = {"names": list(layout.names), "shape": list(layout.shape), "data_dims": list(layout.data_dims)}
    return {
        "world_size": run.world_size,
        "label": row.label,
        "loader": run.loader,
        "mesh": mesh,
        "backend": run.backend,
        "ok": run.ok,
        "skipped": run.skipped,
        "seconds": jsonable(run.seconds),
        "padding": row.padding,
        "idle": row.idle,
        "checks": checks,
        "failures": _failures(run.failures),
        "divergence": [_metric(metric) for metric in run.divergence],
        "resume": [_resume(stop) for stop in run.resume],
    }


def _cause(cause: Cause) -> dict[str, Any]:
    return {
        "number": cause.number,
        "kind": cause.kind,
        "cause": cause.text,
        "explains": cause.explains,
        "fix": cause.fix,
        "where": [
            {"world_size": r.world_size, "label": r.label, "backend": r.backend, "what": what}
            for r, what in cause.where
        ],
    }


def _resume(row: ResumeRow) -> dict[str, Any]:
    return {
        "world_size_from": row.world_size_from,
        "world_size_to": row.world_size_to,
        "change": row.topology,
        "outcome": row.outcome or row.status,
        "epoch": row.epoch,
        "step": row.step,
        "status": row.status,
        "before": row.before,
        "after": row.after,
        "skipped": row.skipped,
        "repeated": row.repeated,
        "first_divergence": row.first_divergence,
        "note": row.note,
        "ranks": [
            {"rank": r.rank, "before": r.before, "after": r.after, "lost": r.lost, "repeated": r.repeated}
            for r in row.ranks
        ],
    }


def _verdict(verdict: Verdict) -> dict[str, Any]:
    return {
        "status": verdict.status,
        "detail": verdict.detail,
        "cause": verdict.cause,
        "fix": verdict.fix,
        "ranks": jsonable(list(verdict.ranks)),
        "epochs": jsonable(list(verdict.epochs)),
        "examples": jsonable(list(verdict.examples)),
        "data": jsonable(verdict.evidence.as_data() if verdict.evidence is not None else {}),
    }


def _failures(failures: Sequence[RankFailure]) -> list[dict[str, Any]]:
    """Every rank's failure; a stack the same as an earlier rank's is said once (4096 ranks failing one
    way would repeat it 4096 times: megabytes of the same text)."""
    first: dict[str, int] = {}
    out = []
    for failure in failures:
        entry = _failure(failure)
        if failure.stack.strip():
            if failure.stack in first:
                entry["stack"] = f"(the same stack as rank {first[failure.stack]})"
            else:
                first[failure.stack] = failure.rank
        out.append(entry)
    return out


def _failure(failure: RankFailure) -> dict[str, Any]:
    return {
        "rank": failure.rank,
        "kind": failure.kind,
        "message": failure.message,
        "stack": failure.stack,
        "progress": failure.progress,
        "output": failure.output,
    }


def _metric(row: MetricRow) -> dict[str, Any]:
    return {
        "metric": row.metric,
        "reference": jsonable(row.reference),
        "naive": jsonable(row.naive),
        "corrected": jsonable(row.corrected),
        "naive_diff": jsonable(row.naive_diff),
        "corrected_diff": jsonable(row.corrected_diff),
        "duplicated": row.duplicated,
        "dropped": row.dropped,
        "order_only": row.order_only,
        "cause": row.cause,
    }


def _mixture(table: MixtureTable) -> dict[str, Any]:
    """One layout's mixture: sources, where the expectation came from, each group's samples and shares."""
    return {
        "label": table.label,
        "status": table.status,
        "sources": list(table.sources),
        "expected_from": table.expected_from,
        "groups": [
            {"who": who, "samples": n, "shares": [round(x, 4) for x in shares]}
            for who, n, shares in table.groups
        ],
    }
