"""The weights an evaluation runs on, held equal across the runs compared (issue 41).

Training moves the weights differently at each world size (other batches per step), so two evaluations are
compared only on the same weights. In each compared evaluation (a round, :mod:`ddpcheck.checker.evaluation`)
a forward pre-hook, armed only while the round is open, finds each model the evaluation calls (the first
module holding parameters that no model found before holds; widened to the largest known model holding
it: the one DistributedDataParallel wraps, or the one the optimizer steps) before its first forward:

- the single process saves its state (parameters, then buffers) to ``DIR/eval/round<k>.pt``;
- a rank of a larger layout given ``--eval-weights DIR`` loads the single process's state of the same
  round and model (by call order; by name where the names agree, else by position where the shapes do),
  and puts its own back when the round ends, before the next training batch or optimizer step;
- every rank fingerprints the state it evaluated (a digest of the tensors' bytes): the judge compares two
  evaluations only when the fingerprints agree.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from ddpcheck.checker import patching
from ddpcheck.checker import replay as rp
from ddpcheck.checker.identity import content_hash
from ddpcheck.checker.models import Models, unwrap_model
from ddpcheck.checks.eval_metric import UNREAD
from ddpcheck.wire.files import eval_round_path

SAVED, LOADED = "saved", "loaded"


def _state(root: Any) -> list[tuple[str, Any]]:
    """The model's parameters, then its buffers, by qualified name."""
    named = [(n, p) for n, p in root.named_parameters()]
    return named + [(n, b) for n, b in root.named_buffers() if b is not None]


def fingerprint(tensors: list[Any]) -> int:
    """The tensors' values (dtype, shape, bytes), as one 63-bit number."""
    return content_hash([t.detach() for t in tensors])


class WeightHolder:
    """Holds the weights of one round at a time. ``save``: the folder the single process saves to ("": none);
    ``load``: the single process's recorded launch whose weights this rank evaluates ("": its own)."""

    def __init__(
        self, models: Models, save: str = "", load: str = "", on_training: Callable[[], None] | None = None
    ) -> None:
        self.models, self.save, self.load = models, save, load
        self.on_training = on_training  # a model's forward ran with gradients on, in train mode
        self.index = -1
        self.hook: Any = None
        self.seen: set[int] = set()
        self.covered: set[int] = set()  # ids of the parameters of the models found so far
        self.saved: list[dict[str, Any]] = []
        self.loaded: list[dict[str, Any]] | None = None
        self.own: list[tuple[Any, Any]] = []  # (tensor, its own value) to put back
        self.fingerprints: list[int] = []
        self.held = ""
        self.why = ""  # why the weights were not held
        import torch

        self.grad_enabled = torch.is_grad_enabled

    def begin(self, index: int, world_size: int) -> None:
        """Round ``index`` starts: find its models at their first forward."""
        import torch.nn.modules.module as module_hooks

        self.end()
        self.index, self.fingerprints, self.saved, self.loaded = index, [], [], None
        self.seen, self.covered, self.why = set(), set(), ""
        if self.load:
            self.held = LOADED
        elif world_size == 1 and self.save:
            self.held = SAVED
        else:
            self.held = ""
            self.why = "this run evaluated its own weights (record it with --eval-weights DIR1)"
        self.hook = module_hooks.register_module_forward_pre_hook(self._pre)

    def end(self) -> None:
        """The round is over: own weights back, the single process's saved."""
        if self.hook is None:
            return
        self.hook.remove()
        self.hook = None
        if self.own:
            import torch

            with torch.inference_mode(False), torch.no_grad():
                for tensor, value in self.own:
                    tensor.copy_(value)
            self.own = []
        if self.held == SAVED and self.saved:
            try:
                rp.save(eval_round_path(self.save, self.index), {"models": self.saved})
            except Exception as exc:  # a state torch cannot save: the judge says the weights were not held
                self.held, self.why = "", f"the weights could not be saved ({type(exc).__name__}: {exc})"

    # --- the models of the round ---------------------------------------------------------------------

    def _pre(self, module: Any, args: Any) -> None:
        training = module.training and self.on_training is not None and self.grad_enabled()
        if training and next(module.parameters(), None) is not None:  # a model, not a loss or a metric
            self.on_training()  # type: ignore[misc]
            return
        key = id(module)
        if key in self.seen:
            return
        self.seen.add(key)
        first = next(module.parameters(), None)
        if first is None or id(first) in self.covered:
            return
        try:  # never break the user's evaluation
            root = self._root(module, first)
            state = _state(root)
            self.covered.update(id(t) for _, t in state)
            self._hold(len(self.fingerprints), state)
            self.fingerprints.append(fingerprint([t for _, t in state]))
        except Exception as exc:  # a layout ddpcheck cannot read (sharded parameters): not held, not compared
            self.held, self.why = "", f"the weights could not be held ({type(exc).__name__}: {exc})"
            self.fingerprints.append(UNREAD)

    def _root(self, module: Any, first: Any) -> Any:
        """The largest known model holding ``first`` (the module itself, unwrapped, where none does)."""
        best = unwrap_model(module)
        size = sum(1 for _ in best.parameters())
        self.models.find_roots()
        for root in self.models.roots:
            if any(p is first for p in root.parameters()):
                count = sum(1 for _ in root.parameters())
                if count >= size:  # the model as the script knows it, also where it adds nothing
                    best, size = root, count
        return best

    def _hold(self, number: int, state: list[tuple[str, Any]]) -> None:
        import torch

        if self.held == SAVED:
            with torch.inference_mode(False), torch.no_grad():
                self.saved.append({n: t.detach().cpu().clone() for n, t in state})
            return
        if self.held != LOADED:
            return
        if self.loaded is None:
            path = eval_round_path(self.load, self.index)
            if not os.path.exists(path):
                self.held, self.why = (
                    "",
                    f"the single process saved no weights for evaluation {self.index + 1}",
                )
                return
            self.loaded = list(rp.load(path)["models"])
        if number >= len(self.loaded):
            self.held, self.why = (
                "",
                f"the single process evaluated {len(self.loaded)} models, this rank more",
            )
            return
        values = _matched(state, self.loaded[number])
        if values is None:
            self.held = ""
            self.why = "the model evaluated here has other parameters than the single process's"
            return
        with torch.inference_mode(False), torch.no_grad():
            for (_, tensor), value in zip(state, values, strict=True):
                self.own.append((tensor, tensor.detach().to("cpu", copy=True)))  # host memory, not the GPU's
                tensor.copy_(value)


def _matched(state: list[tuple[str, Any]], saved: dict[str, Any]) -> list[Any] | None:
    """The saved values for ``state``: by name where the names agree, else by position where the shapes
    do (one process's model is not wrapped, a rank's may be named from another root); None otherwise."""
    names = [n for n, _ in state]
    if names == list(saved) and all(tuple(t.shape) == tuple(saved[n].shape) for n, t in state):
        return [saved[n] for n in names]
    values = list(saved.values())
    if len(values) == len(state) and all(
        tuple(t.shape) == tuple(v.shape) for (_, t), v in zip(state, values, strict=True)
    ):
        return values
    return None


# --- the models a rank's script trains, where the step watcher does not already know them --------------

_OWN: list[Models] = []


def known_models() -> Models:
    """The step watcher's models where it runs, else one :class:`Models` fed by watching optimizers and
    DistributedDataParallel being made (installed once per process)."""
    from ddpcheck.checker.step import active_watcher

    watcher = active_watcher()
    if watcher is not None:
        return watcher.models
    if not _OWN:
        _OWN.append(Models())
        _watch_models(_OWN[0])
    return _OWN[0]


def _watch_models(models: Models) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim import Optimizer

    ref = weakref.ref(models)

    def after(original: Any, action: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            found = ref()
            if found is not None:
                action(found, self)

        init.__wrapped__ = original  # type: ignore[attr-defined]
        init.__doc__ = original.__doc__
        return init

    patching.replace(Optimizer, "__init__", after(Optimizer.__init__, lambda m, o: m.optimizer_made(o)))
    patching.replace(
        DistributedDataParallel,
        "__init__",
        after(DistributedDataParallel.__init__, lambda m, ddp: m.adopt(ddp.module)),
    )
