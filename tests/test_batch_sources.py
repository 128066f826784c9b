"""``--batches NAME`` without a launch: the rank side's recording of a real module's batch function,
generator and method (:mod:`ddpcheck.checker.batch_source`), and the pure judging of what ranks recorded
(:mod:`ddpcheck.checks.batch_sources`) on token streams sliced right, sliced wrong and sampled."""

from __future__ import annotations

import importlib
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ddpcheck.checker.batch_source import BatchSources, parse_name
from ddpcheck.checks.batch_sources import (
    MIN_UNIT,
    SAMPLING,
    STREAM,
    UNKNOWN,
    judge_source,
    mode_of,
    nothing_iterated,
    unit_size,
)
from ddpcheck.layout import Layout
from ddpcheck.trace import ScriptRankTrace, SourceTrace

TOKENS = np.random.default_rng(0).integers(0, 50_000, size=1 << 14)


def _trace(starts: list[list[int]], length: int, window: int = 4, shifted: bool = True) -> SourceTrace:
    """A rank's calls: each call's rows start at the given stream positions; targets shifted by one."""
    tokens, lengths, follows, calls = array("q"), array("q"), array("q"), array("q")
    for call in starts:
        calls.append(len(call))
        for start in call:
            tokens.extend(int(t) for t in TOKENS[start : start + length])
            lengths.append(length)
            follows.append(int(TOKENS[start + length]) if shifted else -1)
    return SourceTrace("src", "tokens", calls, lengths, tokens, follows, window=window)


def _sliced(rank: int, world: int, steps: int, share: int, stride: int | None = None) -> SourceTrace:
    """modded-nanogpt's generator: rank r reads [pos + r*share, pos + (r+1)*share), pos += stride."""
    stride = share * world if stride is None else stride
    return _trace([[s * stride + rank * share] for s in range(steps)], share)


def _judge(reference: SourceTrace, ranks: list[SourceTrace]) -> dict[str, tuple[str, str]]:
    verdicts = judge_source("src", {0: reference}, dict(enumerate(ranks)), {}, Layout.plain(len(ranks)))
    return {v.check: (v.status, v.cause) for v in verdicts}


def test_a_stream_sliced_by_rank_covers_what_one_process_reads() -> None:
    reference = _sliced(0, 1, 16, 256)  # one process: 256 tokens a step
    verdicts = _judge(reference, [_sliced(r, 2, 8, 128) for r in range(2)])
    assert verdicts["coverage"][0] == verdicts["no_overlap"][0] == verdicts["equal_steps"][0] == "pass"
    assert unit_size([reference, _sliced(0, 2, 8, 128)]) == 128
    assert mode_of(reference) == STREAM


def test_every_rank_on_the_same_slice_is_one_cause() -> None:
    verdicts = _judge(_sliced(0, 1, 16, 256), [_trace([[s * 256] for s in range(8)], 128)] * 2)
    assert verdicts["no_overlap"][0] == verdicts["coverage"][0] == "fail"
    assert verdicts["coverage"][1] == verdicts["no_overlap"][1]
    assert verdicts["no_overlap"][1].startswith("every rank reads the same slice of the stream")


def test_a_rank_a_round_ahead_is_allowed_and_a_stride_that_skips_is_not() -> None:
    """A rank that skips its shard's last round (build-nanogpt's DataLoaderLite) misses one call's rows
    in a window: allowed. The neighbour the allowance must not hide: a stride of twice the step skips half
    the stream without any rank reading another's rows: coverage fails, with nothing shared."""
    reference = _trace([[(4 * c + k) * 16 for k in range(4)] for c in range(32)], 16)
    rank0 = _trace([[(8 * c + k) * 16 for k in range(4)] for c in range(8)], 16)
    ahead = _trace([[(8 * c + 4 + k) * 16 for k in range(4)] for c in range(1, 9)], 16)  # a round ahead
    verdicts = _judge(reference, [rank0, ahead])
    assert verdicts["coverage"][0] == "pass" and verdicts["no_overlap"][0] == "pass"
    skipping = [_sliced(r, 2, 8, 128, stride=512) for r in range(2)]
    verdicts = _judge(_sliced(0, 1, 16, 256), skipping)
    assert verdicts["coverage"][0] == "fail" and verdicts["no_overlap"][0] == "pass"
    assert verdicts["coverage"][1].startswith("the ranks read other parts of the stream")


def test_sampling_has_no_coverage_and_ranks_seeded_alike_fail() -> None:
    def draws(seed: int) -> SourceTrace:
        rng = np.random.default_rng(seed)
        return _trace([list(rng.integers(0, 8000, 4)) for _ in range(8)], 32)

    reference = draws(1337)
    assert mode_of(reference) == SAMPLING
    apart = _judge(reference, [draws(1337), draws(1338)])
    assert apart["coverage"][0] == "n/a" and apart["no_overlap"][0] == "pass"
    alike = _judge(reference, [draws(1337), draws(1337)])
    assert alike["no_overlap"][0] == "fail"
    assert alike["no_overlap"][1].startswith("every rank draws the same batches")


def test_without_shifted_targets_the_order_is_unknown_and_short_units_are_rows() -> None:
    plain = _trace([[0], [256]], 256, shifted=False)
    assert mode_of(plain) == UNKNOWN
    assert _judge(plain, [plain, plain])["coverage"][0] == "n/a"
    assert unit_size([_trace([[0]], 12), _trace([[0]], 18)]) is None  # gcd 6 < MIN_UNIT
    assert MIN_UNIT == 8


def test_a_clean_run_without_batches_names_the_function_or_the_last_line() -> None:
    trace = ScriptRankTrace(0, 1, (), first_model_call="t.py:9 (model(x))", inputs_from="get_batch")
    text = nothing_iterated([trace], "")
    assert text.endswith("came from get_batch, at t.py:9 (model(x)); pass --batches get_batch to record "
                         "the batches it returns")  # fmt: skip
    assert nothing_iterated([trace], "", batches="get_btch").startswith(
        "--batches get_btch: the script never called a function of that name"
    )
    silent = nothing_iterated([ScriptRankTrace(0, 1, ())], "loading\nnothing to train\n")
    assert "no model was called; rank 0's last line: nothing to train;" in silent
    assert nothing_iterated([ScriptRankTrace(0, 1, (), status="error")], "") == ""


MODULE = """
import torch

def get_batch(n):
    x = torch.arange(n * 16, dtype=torch.int64).view(n, 16)
    return x, x + 1

def stream(length):
    position = 0
    while True:
        buf = torch.arange(position, position + length + 1)
        position += length
        yield buf[:-1], buf[1:]

class Lite:
    def __init__(self, start):
        self.position = start

    def next_batch(self):
        self.position += 32
        return torch.full((2, 16), self.position, dtype=torch.int64)
"""


class _Stop(BaseException):
    pass


def _stop(message: str) -> None:
    raise _Stop(message)


@pytest.fixture
def batchmod(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "batchmod_under_test.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    yield "batchmod_under_test"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("batchmod_under_test", None)


def _recording(spec: str, window: int = 2, epochs: int = 2) -> BatchSources:
    sources = BatchSources(spec, window, epochs, _stop)
    sources.install()
    return sources


def test_a_function_is_found_once_defined_and_recorded_with_gradients_on(batchmod: str) -> None:
    sources = _recording(f"{batchmod}:get_batch")
    try:
        module = importlib.import_module(batchmod)
        module.get_batch(1)  # found while the module ran (at its class statement), so this call counts
    finally:
        sources.remove()
    assert sources.found and sys.gettrace() is None
    module.get_batch(2)
    with torch.no_grad():
        module.get_batch(2)  # an evaluation's call: counted apart
    module.get_batch(3)
    module.get_batch(1)
    with pytest.raises(_Stop):
        module.get_batch(1)  # the window past the two asked for
    (trace,) = sources.traces()
    assert (trace.name, trace.kind, list(trace.calls), trace.untrained) == (
        "get_batch",
        "tokens",
        [1, 2, 3, 1],
        1,
    )
    assert list(trace.lengths) == [16] * 7 and trace.shape == "int64 1 x 16"
    assert list(trace.follows)[1:3] == [16, 32]  # y = x + 1 here is x shifted by one: the next row's start


def test_a_generator_and_a_method_are_kept_apart_per_object(batchmod: str) -> None:
    module = importlib.import_module(batchmod)
    found = []
    for spec in (f"{batchmod}:stream", f"{batchmod}:Lite.next_batch"):
        sources = _recording(spec, window=8)
        try:
            len([])  # any call: the module already defines the name
        finally:
            sources.remove()
        assert sources.found, spec
        found.append(sources)
    first, second = module.stream(8), module.stream(8)
    assert [int(next(first)[0][0]) for _ in range(3)] == [0, 8, 16]  # the generator, as written
    next(second)
    one, two = module.Lite(0), module.Lite(100)
    one.next_batch(), one.next_batch(), two.next_batch()
    streams, methods = ({t.name: t for t in s.traces()} for s in found)
    assert {n: list(t.calls) for n, t in streams.items()} == {"stream": [1, 1, 1], "stream#2": [1]}
    assert list(streams["stream"].follows) == [8, 16, 24]  # each 1-D slice ends where the next begins
    assert {n: list(t.calls) for n, t in methods.items()} == {
        "Lite.next_batch": [2, 2],
        "Lite.next_batch#2": [2],
    }
    assert list(methods["Lite.next_batch"].follows) == [-1] * 4  # no targets: the order is unknown


def test_a_name_is_checked_for_its_form() -> None:
    assert parse_name("get_batch") == ("__main__", ("get_batch",))
    assert parse_name("pkg.data:Loader.next_batch") == ("pkg.data", ("Loader", "next_batch"))
    with pytest.raises(ValueError, match="give a function's name"):
        parse_name("get batch()")
