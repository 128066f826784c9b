"""The shape of the JSON report of every fixture, as the golden comparison holds it
(``tests/test_golden_json.py``).

A refactor of the judge or of the verdicts' evidence must leave the JSON report's shape as it was: the same
keys at every level (the check ids under ``checks``, each verdict's ``data`` keys) and the same JSON type
for each value. Each case runs through the public API (or the recorder and ``ddpcheck judge`` for a launch
recorded elsewhere); its report is reduced to its :func:`shape` (run-specific values and list lengths
leave; a list keeps the distinct shapes of its items) and compared with ``tests/golden/CASE.json``.

The files under ``tests/golden/`` were written from the reports of the code before the typed evidence
(commit 050d7ea, run with this module's ``produce``), reduced with ``--shapes-of DIR``. Write them again
only after a change that is meant to alter the report's shape, and say so in its commit::

    PYTHONPATH=. python -m tests.golden_json --write [CASE ...]   # from the code as it is
    PYTHONPATH=. python -m tests.golden_json --check [CASE ...]   # every case (minutes): what differs
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
GOLDEN = ROOT / "tests" / "golden"
TIMEOUT = 90.0
LOADER_SIZES = (1, 2, 3)
SMALL_SIZES = (1, 2)
SKIPPED_NAMES = ("truth", "truth_packed", "truth_chains", "truth_stops", "truth_mesh_restore", "keyed_hooks")
# fixtures whose numbers vary from run to run: the faults (stacks, timing of a hang), those that plant the
# variation, and every launch of fresh interpreters (a script's ranks: str hashes and unseeded generators
# differ per process); their numbers are replaced, statuses, sentences and keys stay compared
VARYING = (
    "bug_nondeterministic",
    "bug_random_split_per_rank",
    "faults_",
    "scripts_",
    "steps_",
    "judge_",
    "fingerprint_",
)
# fixtures whose verdicts themselves change from run to run (str hashes randomised per interpreter)
UNSTABLE = ("rank_bug_hash_file_sharding", "scripts_bug_hash_sharding")


@dataclass(frozen=True)
class Case:
    """One golden report: its name (the file under tests/golden/), and how to produce the result."""

    name: str
    kind: str  # loader | script | judge | fingerprint
    path: str  # relative to the repository
    options: dict[str, Any] = field(default_factory=dict)


def _loaders(folder: str, sizes: tuple[int, ...], **options: Any) -> list[Case]:
    base = FIXTURES / folder if folder else FIXTURES
    out = []
    for path in sorted(base.glob("*.py")):
        if path.stem.startswith("_") or path.stem in SKIPPED_NAMES:
            continue
        name = f"{folder}_{path.stem}" if folder else path.stem
        rel = path.relative_to(ROOT).as_posix()
        out.append(Case(name, "loader", rel, {"world_sizes": sizes, "timeout": TIMEOUT, **options}))
    return out


BATCHES = {  # the scripts whose batches come from a function, not a DataLoader (--batches NAME)
    "nanogpt_get_batch": "get_batch",
    "stream_generator": "distributed_data_generator",
    "dataloader_lite": "DataLoaderLite.next_batch",
}


SCRIPTS = {  # the script fixtures held (each is several fresh launches): every rewrite and source kind once
    "scripts": (
        "ddp_good", "bug_no_set_epoch", "bug_seed_rank", "bug_no_distributed_sampler", "fabric_no_launcher",
        "bug_world_size_from_config", "tutorial_peek", "dataloader_lite", "nanogpt_get_batch",
        "stream_generator", "keyed_stream",
    ),
    "steps": (
        "good_equal_batches", "bug_rank_mean_ce", "bug_accum_tail_constant", "bug_sft_all_masked",
        "bug_mesh_noise_global_rank",
    ),
}  # fmt: skip


def _scripts(folder: str) -> list[Case]:
    out = []
    for path in sorted((FIXTURES / folder).glob("*.py")):
        if path.stem not in SCRIPTS[folder]:
            continue
        name = f"{folder.replace('/', '_')}_{path.stem}"
        options: dict[str, Any] = {"world_sizes": SMALL_SIZES}
        if path.stem in BATCHES:
            options.update(batches=BATCHES[path.stem], epochs=3)
        out.append(Case(name, "script", path.relative_to(ROOT).as_posix(), options))
        if path.stem == "keyed_stream":  # its hooks file names the samples (--hooks keyed_hooks.py)
            hooks = {**options, "hooks": str(path.with_name("keyed_hooks.py"))}
            out.append(Case(f"{name}_hooks", "script", path.relative_to(ROOT).as_posix(), hooks))
    return out


def cases() -> list[Case]:
    """Every loader fixture at world sizes 1 to 3 (the folders at 1 and 2; meshes where the fixture is a
    mesh's), the script fixtures of :data:`SCRIPTS` at 1 and 2, and launches recorded elsewhere judged
    afterwards."""
    found = _loaders("", LOADER_SIZES)
    for folder in ("mixture", "tokens", "rank", "scale", "streaming", "resume"):
        found += _loaders(folder, SMALL_SIZES)
    found += _loaders("faults", SMALL_SIZES, timeout=20.0)
    endless = next(i for i, c in enumerate(found) if c.name == "faults_infinite_iterable")
    # it keeps yielding: --timeout (time without progress) never ends it, --max-time does
    found[endless] = Case(
        found[endless].name, "loader", found[endless].path, {**found[endless].options, "max_time": 5.0}
    )
    found += _loaders("mesh", SMALL_SIZES, meshes=("dp=2,tp=2",))
    found += _scripts("scripts") + _scripts("steps")
    found = [c for c in found if c.name not in UNSTABLE]
    found += [
        Case("judge_bug_seed_rank", "judge", "fixtures/scripts/bug_seed_rank.py"),
        Case("judge_ddp_good_alone", "judge", "fixtures/scripts/ddp_good.py", {"reference": False}),
        Case(
            "judge_step_good_equal_batches", "judge", "fixtures/steps/good_equal_batches.py", {"step": True}
        ),
        Case(
            "fingerprint_overlap",
            "fingerprint",
            "fixtures/scale/train_fingerprint.py",
            {"args": ("--size", "20000", "--overlap", "7")},
        ),
        Case(
            "fingerprint_correct",
            "fingerprint",
            "fixtures/scale/train_fingerprint.py",
            {"args": ("--size", "20000")},
        ),
    ]
    return found


# --- producing one case -----------------------------------------------------------------------------------


def _torchrun(out: Path, world: int, script: str, *record: str, args: tuple[str, ...] = ()) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "-m", "ddpcheck.record", "--out", str(out), *record, "--", script, *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, cwd=ROOT, env=env, check=False, capture_output=True, timeout=600)


def _judged(case: Case, tmp: Path) -> Any:
    from ddpcheck.session.script import judge_directory

    if case.kind == "fingerprint":
        _torchrun(tmp / "fp", 3, case.path, "--fingerprint", args=tuple(case.options["args"]))
        return judge_directory(tmp / "fp")
    step = ("--step",) if case.options.get("step") else ()
    _torchrun(tmp / "ws2", 2, case.path, *step)
    reference = None
    if case.options.get("reference", True):
        _torchrun(tmp / "ws1", 1, case.path, *step)
        reference = tmp / "ws1"
    replay = None
    if step:
        _torchrun(tmp / "replay", 1, case.path, "--step", "--replay", str(tmp / "ws2"))
        replay = tmp / "replay"
    return judge_directory(tmp / "ws2", reference, replay=replay)


def produce(case: Case) -> Any:
    """The case's JSON report, normalised (what varies from run to run replaced)."""
    from ddpcheck.options import BadInput, CheckOptions
    from ddpcheck.report.json_report import to_json_dict
    from ddpcheck.session import check_loader
    from ddpcheck.session.script import check_script

    before = os.getcwd()
    os.chdir(ROOT)  # paths in the report are relative to where ddpcheck ran
    try:
        with tempfile.TemporaryDirectory(prefix="ddpcheck-golden-") as tmp:
            try:
                if case.kind == "loader":
                    result = check_loader(case.path, CheckOptions(**case.options))
                elif case.kind == "script":
                    result = check_script(case.path, **case.options)
                else:
                    result = _judged(case, Path(tmp))
                data = to_json_dict(result)
            except BadInput as exc:  # refused as bad input (exit 2): the one line is held too
                data = {"bad_input": str(exc)}
    finally:
        os.chdir(before)
    return normalised(data, case.name.startswith(VARYING))


TIMINGS = ("seconds",)
TEXTS = ("stack", "output")  # a rank's stack and printed lines: ddpcheck's own line numbers, thread ids
_SUBS: tuple[tuple[str, str], ...] = (
    (r"/tmp/[A-Za-z0-9_.-]*(?:ddpchk|ddpcheck|tmp|pytest)[A-Za-z0-9_.-]*", "<tmp>"),
    (re.escape(str(ROOT)), "<root>"),
    (r"\b\d+(?:\.\d+)?\s?s\b(?!\w)", "<t>s"),  # "1.2 s", "0.31s": a duration said in a sentence
    (r"pid \d+", "pid <n>"),
    (r"port \d+", "port <n>"),
)
_VARYING_SUBS: tuple[tuple[str, str], ...] = ((r"\d+", "<n>"),)


def _text(value: str, varying: bool) -> str:
    for pattern, repl in _SUBS + (_VARYING_SUBS if varying else ()):
        value = re.sub(pattern, repl, value)
    return value


def _said(value: Any) -> Any:
    """A stack or a rank's output: whether there is one (and which rank's it repeats), not its lines."""
    if not isinstance(value, str) or not value or value.startswith("(the same stack"):
        return value
    return "<text>"


def normalised(data: Any, varying: bool = False) -> Any:
    """``data`` with timings zeroed, stacks and rank outputs reduced to whether there is one, and temporary
    paths, durations, pids and ports replaced (every number too where the fixture ``varying``)."""
    if isinstance(data, dict):
        out = {k: _said(v) if k in TEXTS else normalised(v, varying) for k, v in data.items()}
        return {k: 0.0 if k in TIMINGS else v for k, v in out.items()}
    if isinstance(data, list):
        return [normalised(v, varying) for v in data]
    if isinstance(data, str):
        return _text(data, varying)
    if varying and isinstance(data, (int, float)) and not isinstance(data, bool):
        return 0
    return data


JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "bool"),  # before int: a bool is an int to Python, not to JSON
    (int, "number"),  # one JSON number type: a count normalised to 0 and a ratio are both numbers
    (float, "number"),
    (str, "str"),
    (type(None), "null"),
)


def shape(data: Any) -> Any:
    """The keys and JSON types of ``data``: a dict keeps its keys (sorted) with their values' shapes, a
    list the distinct shapes of its items (sorted; its length is the run's), a value its type's name."""
    if isinstance(data, dict):
        return {key: shape(data[key]) for key in sorted(data)}
    if isinstance(data, list):
        distinct = {json.dumps(shape(v), sort_keys=True): shape(v) for v in data}
        return [distinct[key] for key in sorted(distinct)]
    for kind, name in JSON_TYPES:
        if isinstance(data, kind):
            return name
    raise TypeError(f"not JSON: {type(data).__name__}")


def evidence_kinds(report_shape: Any) -> set[str]:
    """``check: data keys`` for every verdict in a report's shape: the evidence it holds."""
    found: set[str] = set()
    for run in report_shape.get("runs", []) if isinstance(report_shape, dict) else []:
        for check, verdict in run.get("checks", {}).items():
            found.add(f"{check}: {' '.join(verdict.get('data', {})) or '-'}")
    return found


SHAPES = GOLDEN / "report_shapes.json"
SHARED = 60  # a sub-shape whose JSON is this long or longer is written once, named by its hash


def packed(shapes: dict[str, Any]) -> dict[str, Any]:
    """The shapes of every case with each long sub-shape written once (``"@hash"`` names it in
    ``"shared"``): the verdicts and options of 175 reports repeat, the file stays small and readable."""
    shared: dict[str, Any] = {}

    def share(value: Any) -> Any:
        if isinstance(value, dict):
            value = {k: share(v) for k, v in value.items()}
        elif isinstance(value, list):
            value = [share(v) for v in value]
        else:
            return value
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
        if len(text) < SHARED:
            return value
        name = hashlib.sha1(text.encode()).hexdigest()[:10]
        shared[name] = value
        return "@" + name

    cases_ = {name: share(value) for name, value in sorted(shapes.items())}
    return {"shared": shared, "cases": cases_}


def unpacked(data: dict[str, Any]) -> dict[str, Any]:
    """The shapes of every case, each ``"@hash"`` replaced by what it names."""

    def expand(value: Any) -> Any:
        if isinstance(value, str) and value.startswith("@"):
            return expand(data["shared"][value[1:]])
        if isinstance(value, dict):
            return {k: expand(v) for k, v in value.items()}
        if isinstance(value, list):
            return [expand(v) for v in value]
        return value

    return {name: expand(value) for name, value in data["cases"].items()}


def goldens() -> dict[str, Any]:
    """Every case's shape as written before ({} before the first write)."""
    return unpacked(json.loads(SHAPES.read_text())) if SHAPES.exists() else {}


def write_goldens(shapes: dict[str, Any]) -> None:
    SHAPES.write_text(json.dumps(packed(shapes), indent=1, sort_keys=True) + "\n")


def paths(value: Any, prefix: str = "") -> set[str]:
    """A shape as lines ``runs[].checks.coverage.data.copies: number``: what a failing comparison prints."""
    if isinstance(value, dict) and value:
        return set().union(*(paths(v, f"{prefix}.{k}" if prefix else k) for k, v in value.items()))
    if isinstance(value, list) and value:
        return set().union(*(paths(v, prefix + "[]") for v in value))
    return {f"{prefix}: {json.dumps(value) if isinstance(value, (dict, list)) else value}"}


def difference(before: Any, now: Any) -> str:
    """The lines of the shape that went (``-``) and came (``+``), or the items that differ in number."""
    gone, came = sorted(paths(before) - paths(now)), sorted(paths(now) - paths(before))
    lines = [f"- {p}" for p in gone[:40]] + [f"+ {p}" for p in came[:40]]
    return "\n".join(lines) or "the same paths, in items that differ (a list's items' shapes)"


def main(argv: list[str]) -> int:
    """``--write [CASE ...]``: write the shapes of the named cases (all when none); ``--check``: compare;
    ``--shapes-of DIR``: the shapes of the full reports in DIR (``CASE.json`` each, as an older checkout's
    ``produce`` wrote them)."""
    say: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    names = [a for a in argv if not a.startswith("--")]
    shapes = goldens()
    if "--shapes-of" in argv:
        source = Path(names.pop(0))
        for case in cases():
            if (source / f"{case.name}.json").exists() and (not names or case.name in names):
                shapes[case.name] = shape(json.loads((source / f"{case.name}.json").read_text()))
        write_goldens(shapes)
        return 0
    differing = []
    for case in cases():
        if names and case.name not in names:
            continue
        try:
            got = shape(produce(case))
        except Exception as exc:  # a case that cannot run here is said, not hidden
            say(f"{case.name}: ERROR {type(exc).__name__}: {str(exc)[:300]}")
            differing.append(case.name)
            continue
        if "--write" in argv:
            shapes[case.name] = got
            say(f"{case.name}: written")
        elif shapes.get(case.name) != got:
            differing.append(case.name)
            say(f"{case.name}: DIFFERS\n{difference(shapes.get(case.name), got)}")
        else:
            say(f"{case.name}: same")
    if "--write" in argv:
        write_goldens(shapes)
    if differing:
        say(f"{len(differing)} differ or failed: {' '.join(differing)}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
