"""Resume across topologies on the streaming loaders people resume (fixtures/streaming/).

Each fixture's truth was measured without ddpcheck (fixtures/streaming/truth.py, NOTES.md): what the
library does when a job restarts on the same ranks, on another world size and with another number of
DataLoader workers. Each case runs ddpcheck on real ranks at world sizes 1 and 2 with ``--elastic``
(and ``--resume-workers 0`` where the loader has workers) and checks that every restore is reported
as the library behaves: exact, resharded, refused (with the library's own message) or failed, with
the mechanism named.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import pytest

from ddpcheck.checks.resume_common import BOUNDARY_REPLAY, NOT_ELASTIC_STATE, RANK0_STATE, WORKER_OFFSETS
from ddpcheck.options import CheckOptions
from ddpcheck.restores import ResumeRow
from ddpcheck.result import CheckResult
from ddpcheck.session import check_loader
from ddpcheck.verdict import ELASTIC_RESUME, RESUME
from tests.conftest import FIXTURES

STREAMING = FIXTURES / "streaming"


@dataclass(frozen=True)
class Case:
    fixture: str
    needs: str
    resume: dict[int, str]  # world size -> status of resume
    elastic: dict[int, str]  # world size -> status of elastic_resume
    # (change, epoch, step) -> outcome, for the restores whose outcome the truth fixes
    rows: dict[tuple[str, int, int], str] = field(default_factory=dict)
    cause: str = ""  # the elastic_resume cause (or resume's, for a same-topology bug)
    refused_with: str = ""  # text of the library's refusal on a worker-count change
    workers: bool = True
    notes: dict[tuple[str, int, int], str] = field(default_factory=dict)  # text a restore's note holds
    resume_cause: str = ""  # a phrase of the failing resume verdict's cause


CASES = [
    Case(
        "litdata_streaming.py",
        "litdata",
        resume={1: "pass", 2: "pass"},
        elastic={1: "pass", 2: "fail"},
        rows={
            ("2 -> 1", 0, 1): "resharded",  # truth: 2 -> 1 resharded 0/0 at every stop
            ("2 -> 1", 0, 6): "resharded",
            ("2 -> 1", 0, 12): "resharded",
            ("1 -> 2", 0, 1): "failed",  # the position rounded to a global batch: 4 repeated
            ("1 -> 2", 0, 12): "resharded",
            ("1 -> 2", 0, 24): "refused",  # "num_samples_yielded ... greater than the dataset length"
            ("workers 2 -> 0", 0, 1): "resharded",  # truth: workers 2 -> 0 resharded at every stop
            ("workers 2 -> 0", 0, 6): "resharded",
        },
        cause=NOT_ELASTIC_STATE,
        notes={("1 -> 2", 0, 24): "num_samples_yielded` state is greater than the dataset length"},
    ),
    Case(
        "hf_iterable_stateful.py",
        "datasets",
        # a checkpoint 1 batch after a restore misses a worker that has not started yet (truth:
        # fixtures/resume/chain_bug_torchdata_hf_workers.py); a single restore is exact
        resume={1: "fail", 2: "fail"},
        resume_cause="incomplete state right after restore",
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 1", 0, 1): "failed", ("2 -> 1", 0, 6): "failed"},  # truth: 0/4, 0/24
        cause=NOT_ELASTIC_STATE,
        refused_with="State doesn't contain key '_num_yielded'",
    ),
    Case(
        "torchdata_stateful_sampler.py",
        "torchdata",
        resume={1: "pass", 2: "pass"},
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 1", 0, 1): "failed", ("2 -> 1", 0, 6): "failed"},  # truth: 0/4, 0/24
        cause=NOT_ELASTIC_STATE,
        refused_with="State doesn't contain key '_num_yielded'",
    ),
    Case(
        "torchdata_nodes.py",
        "torchdata",
        resume={1: "pass", 2: "pass"},
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 1", 0, 1): "failed", ("2 -> 1", 0, 6): "failed"},  # truth: 0/4, 0/24
        cause=NOT_ELASTIC_STATE,
        refused_with="KeyError: 'source'",
    ),
    Case(
        "accelerate_stateful.py",
        "accelerate",
        resume={2: "fail"},  # truth: the whole epoch again after the last step
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 2", 0, 12): "failed", ("2 -> 1", 0, 6): "failed"},
        cause=BOUNDARY_REPLAY,
        workers=False,
    ),
    Case(
        "bug_rank0_state_only.py",
        "torch",
        resume={1: "pass", 2: "fail"},  # truth: 2 -> 2 broken 44/44, 24/24, exact after the last step
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 2", 0, 1): "failed", ("2 -> 2", 0, 6): "failed", ("2 -> 1", 0, 1): "failed"},
        cause=RANK0_STATE,
        workers=False,
    ),
    Case(
        "bug_worker_offsets_lost.py",
        "torch",
        resume={2: "fail"},  # truth: 2 -> 2 broken 4/4 after step 1, exact after 6 and 12
        elastic={1: "fail", 2: "fail"},
        rows={("2 -> 2", 0, 1): "failed", ("2 -> 2", 0, 6): "exact", ("workers 2 -> 0", 0, 6): "failed"},
        cause=WORKER_OFFSETS,
    ),
]


def _run(case: Case) -> CheckResult:
    if importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.needs} is not installed (it comes with the 'integrations' extra)")
    options = CheckOptions(
        world_sizes=(1, 2),
        epochs=2,
        timeout=180,
        determinism=False,
        elastic=True,
        resume_workers=(0,) if case.workers else (),
    )
    return check_loader(str(STREAMING / case.fixture), options)


def _rows(result: CheckResult) -> dict[tuple[str, int, int], ResumeRow]:
    return {(row.topology, row.epoch, row.step): row for run in result.runs for row in run.resume}


@pytest.mark.parametrize("case", CASES, ids=[c.fixture.removesuffix(".py") for c in CASES])
def test_streaming_restores_are_reported_as_the_library_behaves(case: Case) -> None:
    result = _run(case)
    assert not any(run.failures for run in result.runs), [f.message for r in result.runs for f in r.failures]
    statuses = {check: {} for check in (RESUME, ELASTIC_RESUME)}  # type: dict[str, dict[int, str]]
    for run in result.runs:
        for verdict in run.verdicts:
            if verdict.check in statuses:
                assert run.world_size not in statuses[verdict.check], f"{verdict.check} twice at {run.label}"
                statuses[verdict.check][run.world_size] = verdict.status
    for ws, status in case.resume.items():
        assert statuses[RESUME][ws] == status, (ws, statuses)
    assert statuses[ELASTIC_RESUME] == case.elastic
    rows = _rows(result)
    for key, outcome in case.rows.items():
        assert key in rows, (key, sorted(rows))
        assert rows[key].outcome == outcome, (key, rows[key])
        if outcome == "failed":
            assert rows[key].skipped + rows[key].repeated > 0, rows[key]
    for key, text in case.notes.items():
        assert text in rows[key].note, rows[key].note
    causes = {v.cause for run in result.runs for v in run.verdicts if v.status == "fail"}
    assert case.cause in causes, causes
    if case.resume_cause:
        verdicts = [v for run in result.runs for v in run.verdicts if v.check == RESUME]
        said = [v.cause for v in verdicts if v.status == "fail"]
        assert said and all(case.resume_cause in cause for cause in said), said
    if case.refused_with:
        refused = [row for key, row in rows.items() if key[0].startswith("workers")]
        assert refused and all(row.outcome == "refused" for row in refused), refused
        assert all(case.refused_with in row.note for row in refused), refused[0].note
