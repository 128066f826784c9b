"""What the script reports, read where it reports it (issue 41), for :class:`~ddpcheck.checker.evaluation.
Evaluations` to keep when an evaluation's loop has ended.

- Lines printed on ``sys.stdout`` (a pass-through stream: every write goes on unchanged) and messages of
  ``logging`` records, line by line; a line carrying a carriage return (a progress bar) is no report.
- Libraries, patched only where the script imports them (a finder on ``sys.meta_path`` patches each one
  as its module finishes loading, or at once where it already was): torchmetrics ``Metric.compute()``
  (the value the script receives, synchronised or not; the batch value its ``forward`` computes is left
  out), HF ``evaluate``'s ``EvaluationModule.compute()``, HF ``Trainer.evaluate()``'s dict, Lightning's
  validation loop (what ``self.log``/``log_dict`` logged for the epoch), ``SummaryWriter.add_scalar(s)``,
  ``wandb``'s ``Run.log`` and ``mlflow.log_metric(s)``.

Reading never changes what the script gets, and an error while reading is swallowed: a report is
evidence, never a reason for the script to fail.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ddpcheck.checker import patching
from ddpcheck.checker.evaluation import Evaluations, numbers

FORWARD_CALLERS = frozenset({"forward", "_forward_full_state_update", "_forward_reduce_state_update"})
_SINK: list[Evaluations] = []


def _sink() -> Evaluations | None:
    return _SINK[0] if _SINK else None


def _report(source: str, name: str, value: Any) -> None:
    sink = _sink()
    if sink is None:
        return
    try:
        for key, number in numbers(value, name):
            sink.report(source, key, number)
    except Exception:  # a value ddpcheck cannot read: not reported
        pass


# --- printed and logged lines ---------------------------------------------------------------------------


class LineTee:
    """``sys.stdout`` as the script sees it: writes pass through; each complete line is read."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._pending = ""
        self.quiet = 0  # >0 while a logging record is handled (read as a record, not as a line)

    def write(self, text: str) -> int:
        written = self._inner.write(text)
        if self.quiet == 0 and _SINK and isinstance(text, str):
            try:
                self._read(text)
            except Exception:
                self._pending = ""
        return written  # type: ignore[no-any-return]

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _read(self, text: str) -> None:
        self._pending += text
        if "\n" not in self._pending:
            if len(self._pending) > 8192:  # an endless line: no report
                self._pending = ""
            return
        *lines, self._pending = self._pending.split("\n")
        sink = _SINK[0]
        for line in lines:
            if "\r" not in line:
                sink.printed(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _watch_lines() -> None:
    if not isinstance(sys.stdout, LineTee):
        sys.stdout = LineTee(sys.stdout)
    original = logging.Logger.handle
    if getattr(original, "_ddpcheck_read", False):
        return

    def handle(self: logging.Logger, record: logging.LogRecord) -> Any:
        tee = sys.stdout if isinstance(sys.stdout, LineTee) else None
        if tee is not None:
            tee.quiet += 1
        try:
            return original(self, record)
        finally:
            if tee is not None:
                tee.quiet -= 1
            sink = _sink()
            if sink is not None:
                try:
                    for line in record.getMessage().splitlines():
                        sink.printed(line, "log")
                except Exception:
                    pass

    handle._ddpcheck_read = True  # type: ignore[attr-defined]
    patching.replace(logging.Logger, "handle", handle)


# --- libraries ------------------------------------------------------------------------------------------


def _torchmetrics(module: ModuleType) -> None:
    metric = module.Metric
    original = metric._wrap_compute

    def _wrap_compute(self: Any, compute: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = original(self, compute)

        @functools.wraps(wrapped)
        def reported(*args: Any, **kwargs: Any) -> Any:
            value = wrapped(*args, **kwargs)
            if sys._getframe(1).f_code.co_name not in FORWARD_CALLERS:  # not forward's batch value
                _report("torchmetrics", type(self).__name__, value)
            return value

        return reported

    patching.replace(metric, "_wrap_compute", _wrap_compute)


def _lightning_epoch_end(module: ModuleType) -> None:
    """Lightning validates at an epoch's end when its batch index reaches the train loader's ``len()``; an
    epoch cut by ``--model-steps`` ends before, and its evaluation would never run. Where Lightning validates
    at the end of a whole epoch (``val_check_interval`` 1.0), it validates after a cut epoch's last batch."""
    loop = module._TrainingEpochLoop
    original = loop._should_check_val_fx

    @functools.wraps(original)
    def _should_check_val_fx(self: Any, data_fetcher: Any) -> bool:
        if original(self, data_fetcher):
            return True
        sink, trainer = _sink(), self.trainer
        at_end = (
            trainer.check_val_every_n_epoch is not None
            and trainer.val_check_batch == trainer.num_training_batches
        )
        return bool(sink is not None and sink.last_batch and at_end and self._should_check_val_epoch())

    patching.replace(loop, "_should_check_val_fx", _should_check_val_fx)


def _returning(source: str, name: Callable[[Any], str] = lambda _self: "") -> Callable[..., Any]:
    """A patch that reports what a method returns (once per outermost call: a subclass calling its base's
    method reports once)."""

    def patch(original: Callable[..., Any]) -> Callable[..., Any]:
        depth = [0]

        @functools.wraps(original)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                value = original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                if isinstance(value, list):  # Lightning: one dict per evaluation loader
                    for item in value:
                        _report(source, name(self), item)
                else:
                    _report(source, name(self), value)
            return value

        return method

    return patch


def _method(owner_path: str, attribute: str, patch: Callable[..., Any]) -> Callable[[ModuleType], None]:
    def apply(module: ModuleType) -> None:
        owner: Any = module
        for part in owner_path.split(".") if owner_path else ():
            owner = getattr(owner, part)
        patching.replace(owner, attribute, patch(getattr(owner, attribute)))

    return apply


def _scalars(source: str, keyed: bool) -> Callable[..., Any]:
    """A patch for a logger call: ``(key, value)`` or ``(mapping)`` (``keyed``: ``(prefix, mapping)``)."""

    def patch(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def log(*args: Any, **kwargs: Any) -> Any:
            try:
                _read_scalars(source, keyed, args, kwargs)
            except Exception:
                pass
            return original(*args, **kwargs)

        return log

    return patch


def _read_scalars(source: str, keyed: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    values = [a for a in args if not _is_self(a)]
    if keyed and len(values) >= 2:  # add_scalars("val", {"acc": ...})
        _report(source, str(values[0]), values[1])
    elif len(values) >= 2 and isinstance(values[0], str):  # add_scalar(tag, value), log_metric(key, value)
        _report(source, values[0], values[1])
    elif values and hasattr(values[0], "items"):  # wandb.log({...}), mlflow.log_metrics({...})
        _report(source, "", values[0])
    else:
        for key in ("tag", "key"):
            if key in kwargs:
                _report(source, str(kwargs[key]), kwargs.get("scalar_value", kwargs.get("value")))


def _is_self(value: Any) -> bool:
    return type(value).__name__ in ("SummaryWriter", "Run")


def _both(*patches: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def apply(module: ModuleType) -> None:
        for patch in patches:
            patch(module)

    return apply


# module -> (the library, what to patch once it has loaded)
LIBRARIES: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    "torchmetrics.metric": ("torchmetrics", _torchmetrics),
    "evaluate.module": (
        "evaluate",
        _method("EvaluationModule", "compute", _returning("evaluate", lambda m: str(getattr(m, "name", "")))),
    ),
    "transformers.trainer": ("transformers", _method("Trainer", "evaluate", _returning("trainer"))),
    "lightning.pytorch.loops.evaluation_loop": (
        "lightning",
        _method("_EvaluationLoop", "run", _returning("lightning")),
    ),
    "pytorch_lightning.loops.evaluation_loop": (
        "lightning",
        _method("_EvaluationLoop", "run", _returning("lightning")),
    ),
    "lightning.pytorch.loops.training_epoch_loop": ("lightning", _lightning_epoch_end),
    "pytorch_lightning.loops.training_epoch_loop": ("lightning", _lightning_epoch_end),
    "torch.utils.tensorboard.writer": (
        "tensorboard",
        _both(
            _method("SummaryWriter", "add_scalar", _scalars("tensorboard", False)),
            _method("SummaryWriter", "add_scalars", _scalars("tensorboard", True)),
        ),
    ),
    "wandb.sdk.wandb_run": ("wandb", _method("Run", "log", _scalars("wandb", False))),
    "mlflow.tracking.fluent": (
        "mlflow",
        _both(
            _method("", "log_metric", _scalars("mlflow", False)),
            _method("", "log_metrics", _scalars("mlflow", False)),
        ),
    ),
    "accelerate.accelerator": ("accelerate", lambda m: None),
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a watched module as soon as it has loaded (the script may import it at any time)."""

    def __init__(self) -> None:
        self.busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in LIBRARIES or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            spec = None
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self._inner, self._name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _patch(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_PATCHED: set[str] = set()


def _patch(name: str, module: ModuleType) -> None:
    if name in _PATCHED:
        return
    _PATCHED.add(name)
    library, apply = LIBRARIES[name]
    try:
        apply(module)
    except Exception:  # another version's layout: that library's values are not read
        return
    sink = _sink()
    if sink is not None:
        sink.imported(library)


def read_reports(evaluations: Evaluations) -> None:
    """Start reading what the script reports, for ``evaluations`` (the rank's; installed once)."""
    first = not _SINK
    _SINK[:] = [evaluations]
    _watch_lines()
    if not first:
        return
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None:
            _patch(name, module)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def stop_reading() -> None:
    """No evaluation reads reports any more (the patches stay, doing nothing)."""
    _SINK.clear()
