"""The JSON report keeps its shape (``tests/golden/report_shapes.json``): a refactor of the judge, of the
verdicts' evidence or of the report leaves the same keys at every level and the same JSON type for each
value, fixture by fixture, as the code before the typed evidence wrote them (:mod:`tests.golden_json`).

Running every fixture costs minutes, so the suite runs the few cases that between them hold every
evidence kind and every key path written by any fixture (:data:`COVERING`, tested to stay so); the whole
comparison is ``python -m tests.golden_json --check``. A change meant to alter the shape writes the file
again (``python -m tests.golden_json --write CASE``) and says why in its commit.
"""

from __future__ import annotations

import pytest

from tests.golden_json import cases, difference, evidence_kinds, goldens, normalised, paths, produce, shape

# Chosen greedily from the golden shapes (the case adding the most paths and evidence kinds per cost, a
# loader fixture costing one run, a script six, a recorded launch ten): a script's report and a judged
# recording (fingerprint_overlap) are among them.
COVERING = (
    "mesh_torchtitan_global_rank", "divergence_padding_accuracy", "tokens_bug_torchtitan_packed_overlap",
    "mixture_bug_same_rng_every_worker", "tokens_bug_loss_local_norm", "bug_random_split_per_rank",
    "scale_bug_int16_index_map", "faults_crash_in_iter", "tokens_bug_buckets_per_rank_no_mask",
    "tokens_bug_packed_drops_tail", "divergence_ranking", "scripts_bug_world_size_from_config",
    "mesh_accelerate_dp_named_mesh", "bug_reseeded_generator", "divergence_drop_last",
    "mixture_hf_interleave_without_replacement", "resume_bug_torchtitan_rank0_checkpoint",
    "train_contiguous_blocks", "bug_iterable_not_split_workers", "bug_multi_epochs_workers",
    "divergence_factory_arg", "faults_infinite_iterable", "fingerprint_overlap", "steps_bug_rank_mean_ce",
)  # fmt: skip
CASES = {case.name: case for case in cases()}


@pytest.mark.slow  # each case is a whole run (the last two, torchrun launches judged afterwards)
@pytest.mark.parametrize("name", COVERING)
def test_the_json_report_keeps_its_shape(name: str) -> None:
    before = goldens()[name]
    now = shape(produce(CASES[name]))
    assert now == before, f"{name}: the JSON report's shape changed:\n{difference(before, now)}"


def test_the_covering_cases_hold_every_path_and_evidence_kind_of_every_fixture() -> None:
    shapes = goldens()
    everything = set().union(*(paths(s) | evidence_kinds(s) for s in shapes.values()))
    covered = set().union(*(paths(shapes[n]) | evidence_kinds(shapes[n]) for n in COVERING))
    assert sorted(everything - covered) == []
    assert len(everything) > 500  # the walk saw the reports' paths, the checks' evidence among them
    assert {CASES[n].kind for n in COVERING} >= {"loader", "script", "fingerprint"}


def test_every_fixture_has_a_golden_shape() -> None:
    missing = sorted(set(CASES) - set(goldens()))
    assert missing == [], f"write their shapes: python -m tests.golden_json --write {' '.join(missing)}"
    assert len([c for c in CASES.values() if c.kind == "loader"]) > 100
    assert "fixtures/good_distributed_sampler.py" in {c.path for c in CASES.values()}


def test_the_shape_keeps_keys_and_types_and_drops_values_and_lengths() -> None:
    one = {"ok": True, "runs": [{"n": 3, "data": {}}, {"n": 0.5, "data": {}}], "stack": None}
    other = {"stack": None, "runs": [{"n": 7, "data": {}}], "ok": False}
    assert (
        shape(one) == shape(other) == {"ok": "bool", "runs": [{"data": {}, "n": "number"}], "stack": "null"}
    )
    assert shape({"runs": [{"n": 1, "data": {"copies": 2}}]}) != shape(other)  # evidence appeared
    assert shape({"ok": "yes"}) != shape({"ok": True})  # a type changed
    gone = difference(shape(one), shape({"ok": True, "runs": [], "stack": None}))
    assert "- runs[].n: number" in gone.splitlines()


def test_the_normalisation_replaces_only_what_varies() -> None:
    data = {"seconds": 1.23, "notes": ["took 0.42s in /tmp/ddpchk-abc12/l1", "rank 3 missed 7"]}
    assert normalised(data) == {"seconds": 0.0, "notes": ["took <t>s in <tmp>/l1", "rank 3 missed 7"]}
    assert normalised(data, varying=True)["notes"][1] == "rank <n> missed <n>"
