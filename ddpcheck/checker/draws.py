"""Random draws the training step makes, recorded (and, in a replay, substituted), and dropout off.

torch's sampling functions (``torch.randn``, ``randint_like``, ``Tensor.normal_``, ...), numpy's legacy
global functions and the ``random`` module's are wrapped once per rank process. Outside a compared
step a wrapper costs one attribute test. Inside one, :class:`DrawRecorder` notes each draw: the user's
line, the call, the shape, a fingerprint of the generator's state before it, and the value (a replay
of another launch needs it). Draws made while loading (anything under ``torch.utils.data``) belong to
the loader and are left alone; draws inside a module's forward are replayed too (stochastic depth, a
masking model) but are not the loop's draws.

A guard keeps a replay honest: it remembers each global stream's state after every draw it saw, and a
state that moved in between (a C++ op that samples, ``F.rrelu``) is named, so the step is reported not
comparable instead of differing for a reason no one can see.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddpcheck.checker import patching, rng
from ddpcheck.trace import Draw

TORCH_FUNCTIONS = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal",
                   "randperm", "multinomial", "bernoulli", "poisson")  # fmt: skip
TENSOR_METHODS = ("normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_",
                  "log_normal_", "cauchy_")  # fmt: skip
NUMPY_FUNCTIONS = ("rand", "randn", "random", "random_sample", "ranf", "sample", "randint", "random_integers",
                   "normal", "uniform", "choice", "permutation", "shuffle", "standard_normal", "beta",
                   "binomial", "exponential", "gamma", "poisson", "multinomial", "dirichlet", "lognormal",
                   "laplace", "logistic", "gumbel", "standard_exponential", "standard_gamma", "geometric",
                   "multivariate_normal", "bytes")  # fmt: skip
RANDOM_FUNCTIONS = ("random", "uniform", "randint", "randrange", "choice", "choices", "sample", "shuffle",
                    "gauss", "normalvariate", "lognormvariate", "expovariate", "vonmisesvariate",
                    "gammavariate", "betavariate", "paretovariate", "weibullvariate", "triangular",
                    "getrandbits", "randbytes", "binomialvariate")  # fmt: skip
RESEEDERS = {
    "torch": ("manual_seed", "seed", "set_rng_state"),
    "numpy": ("seed", "set_state"),
    "random": ("seed", "setstate"),
}
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
LOADING_MODULES = ("torch.utils.data", "torchdata")
GUARDED = ("torch", "numpy", "random")
IN_PLACE = ("shuffle",)  # numpy/random calls that change their argument and return None


class NotReplayable(Exception):
    """A recorded batch or draw cannot be given to a replay faithfully; the message says why."""


@dataclass
class StepDraw:
    """One draw inside a compared step, in call order: what it was, and its value (for a replay)."""

    draw: Draw
    value: Any
    loop: bool  # outside any module's forward: the loop's own draw


Substitute = Callable[[int, Draw, Any], Any]


class DrawRecorder:
    """Collects the draws of the current compared step (``armed``); one per rank process."""

    def __init__(self) -> None:
        self.armed = False  # inside a compared step: draws are recorded, dropout is off
        self.busy = False
        self.keep_values = True
        self.forward_depth: Callable[[], int] = lambda: 0
        self.substitute: Substitute | None = None  # a replay's: the value the draw at index i returns
        self.seq: list[StepDraw] = []
        self.loop_draws: list[Draw] = []  # the loop's draws since the last backward
        self.expected: dict[str, bytes | None] = {}
        self.unexplained: list[str] = []
        self.failures: list[str] = []  # draws a replay could not substitute

    def start(self) -> None:
        self.seq, self.loop_draws, self.unexplained, self.failures = [], [], [], []
        self.expected = rng.snapshot()

    def take_loop_draws(self) -> tuple[Draw, ...]:
        out, self.loop_draws = tuple(self.loop_draws), []
        return out

    def explained(self, states: dict[str, bytes | None]) -> None:
        """Streams moved by something known (a fetch, a reseed): their new states are expected."""
        self.expected.update(states)

    def check(self, where: str) -> None:
        """Name a global stream that moved since the last draw seen (``where``: e.g. "the backward")."""
        if not self.armed:
            return
        now = rng.snapshot()
        for stream in GUARDED:
            if stream in self.expected and now.get(stream) != self.expected.get(stream):
                self.unexplained.append(f"{stream}'s random stream was consumed before {where} by a call "
                                        "ddpcheck does not replay")  # fmt: skip
        self.expected = now

    def draw(self, call: str, original: Callable[..., Any], args: Any, kwargs: Any, kind: str) -> Any:
        self.busy = True
        try:
            return self._draw(call, original, args, kwargs, kind)
        finally:
            self.busy = False

    def _draw(self, call: str, original: Callable[..., Any], args: Any, kwargs: Any, kind: str) -> Any:
        stream, read = _stream_of(kind, args, kwargs)
        before = read() if read is not None else None
        if stream in GUARDED and stream in self.expected and before != self.expected[stream]:
            self.unexplained.append(f"{stream}'s random stream was consumed before {call} by a call "
                                    "ddpcheck does not replay")  # fmt: skip
        result = original(*args, **kwargs)
        if stream in GUARDED:
            self.expected[stream] = read() if read is not None else None
        frame = sys._getframe(3)
        if _loading(frame):
            return result
        from ddpcheck.checker.frames import user_site

        site, _ = user_site(frame)
        value = args[0] if (kind == "tensor" or call.endswith(IN_PLACE)) and args else result
        draw = Draw(stream=stream, state=rng.fold(before) if before else 0, site=site, call=call,
                    shape=_shape(value))  # fmt: skip
        if self.substitute is not None:
            try:
                value, result = _put(self.substitute(len(self.seq), draw, value), value, result, kind)
            except NotReplayable as exc:
                self.failures.append(f"{site} {call}: {exc}")
        self.seq.append(StepDraw(draw, _kept(value) if self.keep_values else None, self.forward_depth() == 0))
        if self.forward_depth() == 0:
            self.loop_draws.append(draw)
        return result


def _put(new: Any, value: Any, result: Any, kind: str) -> tuple[Any, Any]:
    """The replay's value in place of the draw's: copied into an in-place draw's tensor or list."""
    if kind == "tensor":
        value.copy_(new)
        return value, result
    if result is None and isinstance(value, list):  # random.shuffle / np.random.shuffle on a list
        value[:] = list(new)
        return value, result
    if result is None and hasattr(value, "__setitem__") and hasattr(new, "shape"):
        value[...] = new
        return value, result
    return new, new


def _kept(value: Any) -> Any:
    """A copy of a draw's value that later changes to the original cannot reach."""
    if hasattr(value, "detach"):
        return value.detach().cpu().clone()
    if hasattr(value, "copy") and hasattr(value, "shape"):
        return value.copy()
    if isinstance(value, list):
        return list(value)
    return value


def _shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(int(s) for s in shape)
    if isinstance(value, (list, tuple, bytes)):
        return (len(value),)
    return ()


def _loading(frame: Any) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(LOADING_MODULES):
            return True
        frame = frame.f_back
    return False


def _stream_of(kind: str, args: Any, kwargs: Any) -> tuple[str, Callable[[], bytes | None] | None]:
    """Which stream a call draws from, and how to read its state."""
    if kind in ("numpy", "random"):
        return kind, rng.READERS[kind]
    generator = kwargs.get("generator")
    if generator is not None:
        return "generator", lambda: rng.generator_state(generator)
    device = kwargs.get("device")
    if device is None and args and hasattr(args[0], "device"):
        device = args[0].device
    if device is None:
        import torch

        default = getattr(torch, "get_default_device", None)  # torch >= 2.3
        device = default() if default is not None else "cpu"
    kind_of = getattr(device, "type", str(device).split(":")[0])
    if kind_of == "cuda":
        return "cuda", lambda: rng.cuda_state(device)
    if kind_of == "cpu":
        return "torch", rng.torch_state
    return str(kind_of), None


# --- the wrappers ---------------------------------------------------------------------------------------

RECORDER: DrawRecorder | None = None
_installed = False


def install(recorder: DrawRecorder) -> None:
    """Make ``recorder`` the process's; wrap the sampling functions and dropout once."""
    global RECORDER, _installed
    RECORDER = recorder
    if _installed:
        return
    import torch
    import torch.nn.functional as F

    for name in TORCH_FUNCTIONS:
        if hasattr(torch, name):
            patching.replace(torch, name, _wrapped(getattr(torch, name), f"torch.{name}", "torch"))
    for name in TENSOR_METHODS:
        if hasattr(torch.Tensor, name):
            patching.replace(
                torch.Tensor, name, _wrapped(getattr(torch.Tensor, name), f"Tensor.{name}", "tensor")
            )
    _wrap_module(random, RANDOM_FUNCTIONS, "random")
    np = sys.modules.get("numpy")
    if np is None:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy comes with torch here
            np = None
    if np is not None:
        _wrap_module(np.random, NUMPY_FUNCTIONS, "numpy")
        _wrap_reseeders(np.random, RESEEDERS["numpy"], "numpy")
    _wrap_reseeders(torch, RESEEDERS["torch"], "torch")
    _wrap_reseeders(torch.random, RESEEDERS["torch"], "torch")
    _wrap_reseeders(random, RESEEDERS["random"], "random")
    for name in DROPOUTS:
        if hasattr(F, name):
            patching.replace(F, name, _no_dropout(getattr(F, name), 2))
    patching.replace(torch, "dropout", _no_dropout(torch.dropout, 2))
    patching.replace(F, "scaled_dot_product_attention", _no_attention_dropout(F.scaled_dot_product_attention))
    global _fork_registered
    if not _fork_registered:
        os.register_at_fork(after_in_child=_forget)
        _fork_registered = True
    _installed = True


_fork_registered = False


def forget_install() -> None:
    """After :func:`ddpcheck.checker.patching.undo`: the next recorder installs again."""
    global _installed, RECORDER
    _installed, RECORDER = False, None


def _forget() -> None:
    """A forked DataLoader worker: its draws are loading, never the step's."""
    global RECORDER
    RECORDER = None


def _wrap_module(module: Any, names: tuple[str, ...], kind: str) -> None:
    for name in names:
        original = getattr(module, name, None)
        if original is not None and callable(original):
            patching.replace(module, name, _wrapped(original, f"{module.__name__}.{name}", kind))


def _wrapped(original: Callable[..., Any], call: str, kind: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = RECORDER
        if recorder is None or not recorder.armed or recorder.busy:
            return original(*args, **kwargs)
        return recorder.draw(call, original, args, kwargs, kind)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(original, "__name__", call)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _wrap_reseeders(module: Any, names: tuple[str, ...], stream: str) -> None:
    for name in names:
        original = getattr(module, name, None)
        if original is None or getattr(original, "_ddpcheck_reseeder", False):
            continue

        def reseed(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(*args, **kwargs)
            recorder = RECORDER
            if recorder is not None and recorder.armed:
                recorder.explained({stream: rng.READERS[stream]()})
            return result

        reseed._ddpcheck_reseeder = True  # type: ignore[attr-defined]
        reseed.__wrapped__ = original  # type: ignore[attr-defined]
        reseed.__name__ = getattr(original, "__name__", name)
        patching.replace(module, name, reseed)


def _no_dropout(original: Callable[..., Any], training_at: int) -> Callable[..., Any]:
    """``F.dropout(input, p, training, inplace)`` and its kin as the identity inside a compared step."""

    def dropout(*args: Any, **kwargs: Any) -> Any:
        recorder = RECORDER
        if recorder is not None and recorder.armed:
            if len(args) > training_at:
                args = (*args[:training_at], False, *args[training_at + 1 :])
            else:
                kwargs = {**kwargs, "training" if "train" not in kwargs else "train": False}
        return original(*args, **kwargs)

    dropout.__wrapped__ = original  # type: ignore[attr-defined]
    dropout.__name__ = getattr(original, "__name__", "dropout")
    dropout.__doc__ = getattr(original, "__doc__", None)
    return dropout


def _no_attention_dropout(original: Callable[..., Any]) -> Callable[..., Any]:
    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
        recorder = RECORDER
        if recorder is not None and recorder.armed:
            if len(args) > 4:
                args = (*args[:4], 0.0, *args[5:])
            elif "dropout_p" in kwargs:
                kwargs = {**kwargs, "dropout_p": 0.0}
        return original(*args, **kwargs)

    scaled_dot_product_attention.__wrapped__ = original  # type: ignore[attr-defined]
    scaled_dot_product_attention.__doc__ = getattr(original, "__doc__", None)
    return scaled_dot_product_attention
