"""What a recording rank and its parent exchange (issue 44 item 5): the rank's arguments, typed once
(:class:`~ddpcheck.wire.argv.RecordArgs`, built by the session, parsed by ``python -m ddpcheck.record``),
and the names of the files a rank writes for the parent (:mod:`ddpcheck.wire.files`)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpcheck.wire.argv import ArgvError, RecordArgs, split_command
from tests.conftest import ROOT

PROPERTY = settings(max_examples=300, derandomize=True, deadline=None)

# any text a path, a directory or a script's argument may be, options' look-alikes included ("-1", "--",
# "-m", "--out", "a=b"): the command line must carry each as a value, never read it as an option
texts = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["-1", "--", "-m", "--out", "--epochs", "a=b", "-", " ", "all", "--help", "-h"]),
)
values = texts.filter(lambda v: v != "--")  # argparse drops an option's value of "--" (it ends options)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
batch_names = st.one_of(
    st.just(""),
    st.builds(lambda m, q: f"{m}:{q}" if m else q, st.sampled_from(["", "data", "pkg.mod"]), identifiers),
)
meshes = st.lists(st.sampled_from(["dp", "tp", "cp", "pp", "dp_shard"]), min_size=1, max_size=3, unique=True)


@st.composite
def records(draw: st.DrawFn) -> RecordArgs:
    module = draw(st.one_of(st.just(""), texts))
    path = "" if module else draw(texts.filter(lambda p: p != "-m"))  # after --, "-m" names a module
    dims = draw(st.one_of(st.none(), meshes))
    mesh = None if dims is None else ",".join(f"{d}={draw(st.integers(1, 4))}" for d in dims)
    return RecordArgs(
        out=draw(values),
        path=path,
        module=module,
        script_args=tuple(draw(st.lists(texts, max_size=4))),
        epochs=draw(st.integers(1, 5)),
        model_steps=draw(st.one_of(st.none(), st.integers(1, 10**6))),
        steps=draw(st.one_of(st.none(), st.integers(1, 64))),
        hooks=draw(st.one_of(st.just(""), values)),
        digest=draw(st.booleans()),
        work=draw(st.booleans()),
        work_cost=draw(st.sampled_from(["tokens", "attention"])),
        batches=draw(batch_names),
        fingerprint=draw(st.booleans()),
        step=draw(st.booleans()),
        replay=draw(st.one_of(st.just(""), values)),
        replay_twice=draw(st.booleans()),
        mesh=mesh,
        data_dims=draw(st.one_of(st.none(), st.lists(identifiers, min_size=1, max_size=3).map(tuple))),
        ignore_index=draw(st.integers(-(2**40), 2**40)),
        compare_batches=draw(st.one_of(st.none(), st.integers(0, 100))),
        tail_batches=draw(st.integers(0, 100)),
        eval_rounds=draw(st.integers(0, 5)),
        eval_weights=draw(st.one_of(st.just(""), values)),
    )


@PROPERTY
@given(records())
def test_a_record_reads_back_as_itself(record: RecordArgs) -> None:
    argv = record.to_argv()
    assert RecordArgs.from_argv(argv) == record
    assert argv[:2] == ["--out", record.out] or argv[0] == f"--out={record.out}"


def test_the_defaults_write_only_the_directory_and_the_script() -> None:
    """A rank told nothing but where to write runs with the parser's defaults: the record's defaults are
    the parser's (one definition), so the session writes only what differs."""
    assert RecordArgs(out="o", path="t.py").to_argv() == ["--out", "o", "--", "t.py"]
    assert RecordArgs.from_argv(["--out", "o", "--", "t.py"]) == RecordArgs(out="o", path="t.py")
    assert RecordArgs(out="o", module="pkg.train", script_args=("--epochs", "9")).to_argv() == [
        "--out", "o", "-m", "pkg.train", "--epochs", "9"
    ]  # fmt: skip


def test_the_documented_commands_parse_to_what_they_say() -> None:
    """docs/meshes.md and docs/scripts.md: a replay of a mesh, a model-steps window, a negative index."""
    replay = shlex.split("--out traces/replay --replay traces/mesh --mesh dp=2,tp=2 -- train.py")
    assert RecordArgs.from_argv(replay) == RecordArgs(
        out="traces/replay", path="train.py", replay="traces/mesh", mesh="dp=2,tp=2"
    )
    window = shlex.split("--out traces/ws8 --model-steps all --ignore-index -1 -- train.py --config a.yaml")
    assert RecordArgs.from_argv(window) == RecordArgs(
        out="traces/ws8", path="train.py", script_args=("--config", "a.yaml"), model_steps=None,
        ignore_index=-1,
    )  # fmt: skip
    told = RecordArgs.from_argv(["--out", "o", "--no-work", "--step", "--no-step", "--", "t.py"])
    assert told.work is False and told.step is False
    assert split_command(["--out", "o", "-m", "m", "-m", "x"]) == (["--out", "o"], "", "m", ["-m", "x"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "o", "--epochs", "0", "--", "t.py"], "argument --epochs: expected a positive integer"),
        (["--out", "o"], "give the script after --: -- train.py ARGS, or -m MODULE ARGS"),
        (["--", "t.py"], "the following arguments are required: --out"),
        (["--out", "o", "--batches", "a b", "--", "t.py"], "argument --batches: --batches 'a b': give a"),
        (["--out", "o", "--mesh", "dp=x", "--", "t.py"], "argument --mesh: mesh 'dp=x': size of dp must be"),
        (["--out", "o", "--work-cost", "flops", "--", "t.py"], "argument --work-cost: invalid choice"),
    ],
)
def test_a_bad_command_line_is_one_argparse_line(argv: list[str], message: str) -> None:
    with pytest.raises(ArgvError) as caught:
        RecordArgs.from_argv(argv)
    assert str(caught.value).startswith(message)


def test_the_rank_says_a_bad_command_line_in_one_line_and_exits_2() -> None:
    """The entry point users run under torchrun: argparse's usage and one error line, exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "ddpcheck.record", "--out", "o", "--epochs", "0", "--", "t.py"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "usage: python -m ddpcheck.record --out DIR [OPTIONS] -- SCRIPT [ARGS...] | -m MODULE [ARGS...]",
        "python -m ddpcheck.record: error: argument --epochs: expected a positive integer, got '0'",
    ]
