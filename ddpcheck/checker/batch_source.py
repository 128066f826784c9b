"""Batches that come from no DataLoader, recorded at the function that returns them (``--batches NAME``).

nanoGPT's ``get_batch(split)``, modded-nanogpt's ``distributed_data_generator`` (a generator),
build-nanogpt's ``DataLoaderLite.next_batch``: NAME is a function, generator function or method of the
script (``get_batch``, ``DataLoaderLite.next_batch``) or of a module (``data:get_batch``). The script
defines it as it runs, so :class:`BatchSources` watches calls (``sys.settrace``, returning no local
tracer) only until NAME exists, then replaces it where it is defined (and where the user's modules
imported it) by a wrapper, and stops watching. Each call made with gradients on is one step of that
source (a method's calls are kept apart per object, a generator's per generator); its inputs' rows are
recorded (:class:`~ddpcheck.trace.SourceTrace`). Windows of ``window`` calls are the checks' epochs;
before the call that would start the window past ``epochs``, :class:`~ddpcheck.checker.script.StopScript`
ends the script, as the loaders' last epoch does.
"""

from __future__ import annotations

import functools
import inspect
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType, FunctionType, ModuleType
from typing import Any

from ddpcheck.checker.script_env import RecorderError
from ddpcheck.launch.userfiles import is_user_file
from ddpcheck.trace import SourceTrace
from ddpcheck.wire.argv import parse_name  # the form of --batches NAME, checked where it is parsed

MAX_TOKENS = 1 << 24  # tokens one rank keeps per source (128 MB): beyond, fewer calls per window will do
INPUT_KEYS = ("input_ids", "inputs", "input", "x", "tokens", "idx")
TARGET_KEYS = ("labels", "targets", "target", "y")


@dataclass
class _Source:
    """One stream of calls: a function, one object's method, or one generator."""

    name: str
    kind: str = ""
    calls: array[int] = field(default_factory=lambda: array("q"))
    lengths: array[int] = field(default_factory=lambda: array("q"))
    tokens: array[int] = field(default_factory=lambda: array("q"))
    follows: array[int] = field(default_factory=lambda: array("q"))
    digests: array[int] = field(default_factory=lambda: array("q"))
    untrained: int = 0
    shape: str = ""

    def trace(self, window: int) -> SourceTrace:
        return SourceTrace(
            self.name, self.kind or "rows", self.calls, self.lengths, self.tokens, self.follows,
            self.digests, self.untrained, self.shape, window,
        )  # fmt: skip


class BatchSources:
    """Records the calls of the function named by ``spec`` (see the module's docstring)."""

    def __init__(self, spec: str, window: int, epochs: int, stop: Callable[[str], None]) -> None:
        self.spec, self.window, self.epochs, self.stop = spec, window, epochs, stop
        self.module, self.parts = parse_name(spec)
        self.sources: dict[int, _Source] = {}
        self.keep: list[Any] = []  # objects and generators keyed by id: their ids must not be reused
        self.found = False
        self.original: Any = None

    # --- finding NAME once the script has defined it
    def install(self) -> None:
        sys.settrace(self._look)

    def remove(self) -> None:
        if sys.gettrace() == self._look:
            sys.settrace(None)

    def _look(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and not self.found and self._patch():
            self.remove()

    def _patch(self) -> bool:
        module = sys.modules.get(self.module)
        if not isinstance(module, ModuleType):
            return False
        owner: Any = module
        for part in self.parts[:-1]:
            owner = getattr(owner, part, None)
            if owner is None:
                return False
        name = self.parts[-1]
        raw = vars(owner).get(name) if isinstance(owner, (type, ModuleType)) else None
        function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not isinstance(function, FunctionType) or not is_user_file(function.__code__.co_filename):
            return False
        method = isinstance(owner, type) and not isinstance(raw, (staticmethod, classmethod))
        wrapper = self._wrap(function, method)
        setattr(owner, name, type(raw)(wrapper) if isinstance(raw, (staticmethod, classmethod)) else wrapper)
        if owner is module:
            _rebind(function, wrapper)
        self.found, self.original = True, function
        return True

    def _wrap(self, function: FunctionType, method: bool) -> Callable[..., Any]:
        generator = inspect.isgeneratorfunction(function)
        qualname = function.__qualname__

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if generator:
                return _Stream(self, function(*args, **kwargs), qualname)
            source = self._source(args[0] if method and args else function, qualname)
            if source is None:
                return function(*args, **kwargs)
            value = function(*args, **kwargs)
            self.record(source, value)
            return value

        return wrapper

    # --- one call
    def _source(self, key: Any, qualname: str) -> _Source | None:
        """The stream this call belongs to, the stop checked first; None: gradients are off (an
        evaluation's call, counted apart)."""
        import torch

        source = self.sources.get(id(key))
        if source is None:
            count = sum(1 for s in self.sources.values() if s.name.split("#")[0] == qualname)
            source = _Source(qualname if not count else f"{qualname}#{count + 1}")
            self.sources[id(key)] = source
            self.keep.append(key)
        if not torch.is_grad_enabled():
            source.untrained += 1
            return None
        if len(source.calls) >= self.window * self.epochs:
            self.stop(f"{source.name}: {self.epochs} windows of {self.window} calls recorded")
        return source

    def record(self, source: _Source, value: Any) -> None:
        """The call's rows; a value the recorder cannot read makes the source "mixed" (not judged), and
        never fails the script."""
        try:
            self._record(source, value)
        except RecorderError:
            raise
        except Exception:
            source.kind = "mixed"

    def _record(self, source: _Source, value: Any) -> None:
        inputs, targets = _inputs(value)
        if inputs is None or inputs.dim() == 0:
            inputs = None
            kind, rows = "rows", [_digest(value)]
            self._add_digests(source, rows)
        elif _is_tokens(inputs):
            kind = "tokens"
            self._add_tokens(source, inputs, targets)
        else:
            kind = "rows"
            self._add_digests(source, [_digest(row) for row in inputs.reshape(inputs.shape[0], -1)])
        if not source.shape:
            source.shape = _shape(inputs)
        source.kind = kind if source.kind in ("", kind) else "mixed"

    def _add_tokens(self, source: _Source, inputs: Any, targets: Any) -> None:
        rows = inputs.reshape(1, -1) if inputs.dim() == 1 else inputs
        rows = rows.detach().to("cpu", dtype=_int64())
        follows = [-1] * rows.shape[0]
        if targets is not None and targets.shape == inputs.shape:
            shifted = targets.reshape(rows.shape).detach().to("cpu", dtype=_int64())
            if rows.shape[1] > 1 and bool((shifted[:, :-1] == rows[:, 1:]).all()):
                follows = shifted[:, -1].tolist()
        if len(source.tokens) + rows.numel() > MAX_TOKENS:
            raise RecorderError(
                f"--batches {self.spec}: more than {MAX_TOKENS:,} tokens a rank in {self.epochs} windows of "
                f"{self.window} calls; record fewer calls per window (--steps)"
            )
        data = rows.contiguous().numpy().tobytes()  # everything read before anything is kept
        source.calls.append(rows.shape[0])
        source.lengths.extend([rows.shape[1]] * rows.shape[0])
        source.tokens.frombytes(data)
        source.follows.extend(int(f) for f in follows)

    @staticmethod
    def _add_digests(source: _Source, digests: list[int]) -> None:
        source.calls.append(len(digests))
        source.digests.extend(digests)

    def traces(self) -> tuple[SourceTrace, ...]:
        return tuple(s.trace(self.window) for s in self.sources.values() if len(s.calls) or s.untrained)


class _Stream:
    """A generator of the script, recorded at every ``next()``; otherwise the generator itself."""

    def __init__(self, sources: BatchSources, generator: Iterator[Any], qualname: str) -> None:
        self.sources, self.generator, self.qualname = sources, generator, qualname

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        source = self.sources._source(self, self.qualname)
        value = next(self.generator)
        if source is not None:
            self.sources.record(source, value)
        return value

    def send(self, value: Any) -> Any:
        return self.generator.send(value)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.generator.close()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.generator, name)


def _rebind(original: FunctionType, wrapper: Callable[..., Any]) -> None:
    """Where the user's modules imported the function by name (``from data import get_batch``)."""
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None)
        path = getattr(module, "__file__", None)
        if not isinstance(space, dict) or not path or not is_user_file(path):
            continue
        for key, value in list(space.items()):
            if value is original:
                space[key] = wrapper


def _int64() -> Any:
    import torch

    return torch.int64


def _inputs(value: Any) -> tuple[Any, Any]:
    """(the batch's inputs, the targets beside them) among its tensors; (None, None) where none."""
    import torch

    if isinstance(value, torch.Tensor):
        return value, None
    if isinstance(value, dict):
        tensors = {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}
        first = next((tensors[k] for k in INPUT_KEYS if k in tensors), next(iter(tensors.values()), None))
        target = next((tensors[k] for k in TARGET_KEYS if k in tensors), None)
        return first, target
    if isinstance(value, (tuple, list)):
        items = [v for v in value if isinstance(v, torch.Tensor)]
        if items:
            rest = [t for t in items[1:] if t.shape == items[0].shape]
            return items[0], rest[0] if rest else None
    return None, None


def _is_tokens(tensor: Any) -> bool:
    return (not tensor.is_floating_point() and not tensor.is_complex()) and tensor.dim() in (1, 2)


def _shape(inputs: Any) -> str:
    if inputs is None:
        return "no tensor"
    return f"{str(inputs.dtype).removeprefix('torch.')} {' x '.join(map(str, inputs.shape))}"


def _digest(value: Any) -> int:
    """A content digest of a row (or of a whole value that holds no tensor)."""
    import hashlib

    import torch

    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().numpy().tobytes() + str(value.dtype).encode()
    else:
        data = repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
