"""The step watcher: what one rank's training step does with the data it is handed.

One :class:`StepWatcher` per rank process, installed like the script recorder, while the script runs
unmodified. It counts backward passes (``torch.autograd.backward``, which ``Tensor.backward`` calls)
and closes a window at every ``optimizer.step()`` (torch's global step pre-hook): a
:class:`~ddpcheck.trace.MicroStep` per backward, an :class:`~ddpcheck.trace.OptimizerStep` per step.
In a compared window it also counts forward calls of every submodule holding parameters, keeps the
gradient the step applies (after DDP's averaging, before clipping: on entry to ``clip_grad_norm_`` and
kin, else at the step), records random draws and switches dropout off. Outside compared windows the
hooks cost a counter and an attribute test.

The recorder calls it (see :class:`StepWatcher` for when): ``handed`` for every batch the script
receives (it returns the batch to hand, a replay's substitute), ``window_open`` to keep handing
batches until the accumulation window closes, ``fetch_draws`` when it stores an epoch.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ddpcheck.checker import draws as draws_module
from ddpcheck.checker import norms, patching, rng
from ddpcheck.checker import replay as rp
from ddpcheck.checker.consumed import Handoff, Part, fetched_ahead, one_batch_each
from ddpcheck.checker.draws import DrawRecorder, NotReplayable
from ddpcheck.checker.feeds import Tokens, batch_tokens, forward_tokens
from ddpcheck.checker.grads import KEEP_LIMIT, GradKeeper, KeptGrad, Unreadable, local_part, optimizer_params
from ddpcheck.checker.keyed import DrawMatcher, Key, RecordedDraw
from ddpcheck.checker.models import Models
from ddpcheck.checker.norms import PartNorm
from ddpcheck.options import IGNORE_INDEX
from ddpcheck.trace import Draw, FetchDraws, MicroStep, ModelFeed, OptimizerStep, StepTrace
from ddpcheck.wire.files import params_path, step_folder, step_rank_folder, window_name


@dataclass(frozen=True)
class StepOptions:
    """What the watcher records. Plain data: it travels to the rank on its command line."""

    out: str = ""  # the launch's trace folder: compared windows are saved under out/step/ ("": not saved)
    replay: str = ""  # a recorded launch's folder: this run replays its windows at world size 1
    ignore_index: int = IGNORE_INDEX
    compare_batches: int | None = None  # windows starting in an epoch's first N batches (None: all)
    tail_batches: int = 0  # and windows starting in its last N batches (where the loader has a len)
    keep: int = KEEP_LIMIT  # gradient coordinates kept per step
    fetch: bool = True  # watch the random streams each fetch consumes
    twice: bool = False  # a replay fed every rank's batch (and draws) twice: how the loss scales
    replay_ranks: tuple[int, ...] | None = None  # the recorded ranks the replay joins (None: every rank)


@dataclass
class _Pending:
    """What the loop did since the last backward."""

    handoffs: list[Handoff] = field(default_factory=list)
    samples: int = 0
    supervised: int | None = None
    parts: list[Part] = field(default_factory=list)  # each handoff with its own samples and labels
    forwards: Counter[str] = field(default_factory=Counter)
    draws_before: int = 0  # the loop's draws made before the first batch was handed over
    handed_tokens: Tokens = ()  # the first batch's token tensors (compared windows)
    fed_tokens: Tokens | None = None  # what the model's first outermost forward was given (ditto)


@dataclass
class _Window:
    """From one optimizer step to the next."""

    armed: bool = False
    name: str = ""  # the file name of its record, set at its first batch
    micro: list[MicroStep] = field(default_factory=list)
    parts: list[list[Part]] = field(default_factory=list)  # per micro-step, the batches handed before it
    handoffs: list[Handoff] = field(default_factory=list)
    batches: dict[str, Any] = field(default_factory=dict)  # "loader|epoch|position" -> plain batch
    reasons: list[str] = field(default_factory=list)  # why it cannot be compared
    unsaved: list[str] = field(default_factory=list)  # why a replay will not have its batches
    recorded: rp.RecordedWindow | None = None  # a replay's: every rank's record of this window
    matcher: DrawMatcher | None = None  # a replay's: which recorded draw each of its draws stands for
    kept: dict[int, KeptGrad] = field(default_factory=dict)  # per optimizer, since the last backward

    @property
    def backwards(self) -> int:
        return len(self.micro)


def handoff_key(handoff: Handoff) -> str:
    return f"{handoff[0]}|{handoff[1]}|{handoff[2]}"


class StepWatcher:
    """Watches one rank's training step. The recorder calls, in the script's thread:

    - :meth:`handed` with every batch the script receives, before handing it (returns the batch to hand);
    - :meth:`window_open` before deciding to stop handing an epoch's batches (keep handing while True);
    - :meth:`fetch_draws` with the loader whenever it stores an epoch (or window) of it;
    - :meth:`finish` once the script has ended: the :class:`~ddpcheck.trace.StepTrace`.
    """

    def __init__(self, options: StepOptions) -> None:
        self.options = options
        self.steps: list[OptimizerStep] = []
        self.handed_log: list[tuple[MicroStep, list[Part]]] = []  # every micro-step as handed, in order
        self.pending = _Pending()
        self.window = _Window()
        self.draws = DrawRecorder()
        self.draws.forward_depth = lambda: self.depth
        self.draws.keep_values = bool(options.out)
        self.keeper = GradKeeper(options.keep)
        self.fetch: rng.FetchWatch | None = None
        self.models = Models()
        self.norms = PartNorm()  # a replay's batch norms: each rank's part of the union on its own
        self.norms.name = lambda module: self.models.names.get(id(module))
        import torch

        self.grad_enabled = torch.is_grad_enabled
        self.depth = 0
        self.in_backward = False
        self.stepping = 0
        self.hooks: list[Any] = []
        self.dropout_off = False
        self.last_kept: KeptGrad | None = None
        self.notes: list[str] = []
        self.wired = False  # the recorder hands batches through handed()

    # --- the recorder's calls ------------------------------------------------------------------------

    def handed(self, loader: str, epoch: int, position: int, batch: Any, length: int | None = None) -> Any:
        """The script is about to receive ``batch``, ``loader``'s batch ``position`` of ``epoch``
        (``length``: the epoch's batches where known). Returns the batch to hand it: the batch itself,
        or in a replay the union of what every recorded rank received there."""

        if not self.grad_enabled():  # an evaluation loop's batch: no backward will use it
            return batch
        self.wired = True
        window = self.window
        handoff = (loader, epoch, position)
        if not window.name:
            self._first_batch(window, handoff, length)
        window.handoffs.append(handoff)
        pending = self.pending
        if window.armed:
            if self.options.replay:
                batch = self._substitute(window, handoff, batch)
            elif self.options.out:
                self._save_batch(window, handoff, batch)
            if not pending.handoffs:
                pending.handed_tokens = batch_tokens(batch)
        if not pending.handoffs:
            pending.draws_before = len(self.draws.loop_draws)
        pending.handoffs.append(handoff)
        count = batch_samples(batch)
        pending.samples = -1 if count < 0 or pending.samples < 0 else pending.samples + count
        labelled = supervised(batch, self.options.ignore_index)
        if labelled is not None:
            pending.supervised = (pending.supervised or 0) + labelled
        pending.parts.append((handoff, count, labelled))
        return batch

    def window_open(self) -> bool:
        """A backward ran since the last optimizer step: the accumulation window is not closed yet."""
        return self.window.backwards > 0

    def fetch_draws(self, loader: Any) -> tuple[FetchDraws, ...] | None:
        """The random streams each batch ``loader`` delivered since the last call consumed while it was
        built (positions from 0, delivery order); None where its fetches were not watched."""
        return self.fetch.take(loader) if self.fetch is not None else None

    def finish(self) -> StepTrace:
        """Stop watching; what the step did, as plain data."""
        global ACTIVE
        self._disarm()
        if ACTIVE is self:
            ACTIVE = None
        draws_module.RECORDER = None
        if self.fetch is not None:
            self.fetch.close()
        kept = self.last_kept
        steps, open_micro = self._consumed()
        return StepTrace(
            steps=steps,
            open_micro=open_micro,
            parameters=kept.parameters if kept else sum(p.numel() for p in self.models.params()),
            kept=len(kept.values) if kept else 0,
            grad_dtype=kept.dtype if kept else "",
            per_rank_norm=tuple(self.norms.modules if self.options.replay else self.models.per_rank_norm),
            dropout_off=self.dropout_off,
            replay=self.options.replay,
            notes=tuple(dict.fromkeys(self.notes)),
            twice=self.options.twice,
            replay_ranks=self.options.replay_ranks,
        )

    def _consumed(self) -> tuple[tuple[OptimizerStep, ...], tuple[MicroStep, ...]]:
        """The steps and the open window's micro-steps, each micro-step with the batch it consumed where the
        loader fetched ahead across steps (:func:`fetched_ahead`)."""
        steps, open_micro = tuple(self.steps), tuple(self.window.micro)
        ahead = fetched_ahead([m for m, _ in self.handed_log], [p for _, p in self.handed_log])
        if ahead is None or len(ahead) != sum(len(s.micro) for s in steps) + len(open_micro):
            return steps, open_micro
        out, at = [], 0
        for step in steps:
            out.append(replace(step, micro=ahead[at : at + len(step.micro)]))
            at += len(step.micro)
        return tuple(out), ahead[at:]

    # --- windows -------------------------------------------------------------------------------------

    def _compared(self, position: int, length: int | None) -> bool:
        first, tail = self.options.compare_batches, self.options.tail_batches
        if first is None or position < first:
            return True
        return bool(tail and length is not None and position >= length - tail)

    def _first_batch(self, window: _Window, handoff: Handoff, length: int | None) -> None:
        loader, epoch, position = handoff
        window.name = window_name(loader, epoch, position)
        compare = self._compared(position, length)
        if compare and self.options.replay:
            compare = self._load_recorded(window)
        if not compare:
            self._disarm()
            window.armed = False
            return
        if not window.armed:
            self._arm(window)
        if self.options.out and not self.options.replay:
            self._save_weights(window)

    def _arm(self, window: _Window) -> None:
        import torch.nn.modules.module as module_hooks

        window.armed = True
        self.dropout_off = True
        self.draws.start()
        self.draws.armed = True
        if not self.hooks:
            self.hooks = [
                module_hooks.register_module_forward_pre_hook(self._forward_pre),
                module_hooks.register_module_forward_hook(
                    self._forward_post, always_call=True, with_kwargs=True
                ),
            ]

    def _disarm(self) -> None:
        self.draws.armed = False
        self.norms.calling = []
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        self.depth = 0

    def _open_window(self) -> None:
        self.window = _Window()
        self.norms.problems, self.norms.parts = [], None
        if self.wired and (self.options.compare_batches != 0 or self.options.tail_batches):
            self._arm(self.window)  # before its first batch: draws the loop makes first are seen too

    def _close_window(self, optimizer: Any) -> None:
        window = self.window
        kept = window.kept.get(id(optimizer))
        if kept is None and window.armed and window.backwards:
            kept = self.keeper.keep(optimizer_params(optimizer))
        reasons = list(window.reasons)
        if kept is not None and kept.unreadable:
            reasons.append(f"the gradient was not read: {kept.unreadable}")
            kept = None
        if window.armed:
            reasons += self.draws.unexplained + self.draws.failures + self.norms.problems
            if self.options.replay and window.recorded is None and window.backwards:
                # no batch of its own was handed in this window (a loader that fetches ahead handed it
                # in the previous one): nothing loaded the run's weights here, so it starts elsewhere
                reasons.append("the step's batches were handed in an earlier step: the replay has no weights")
            elif self.options.replay:
                reasons += self._replay_mismatch(window)
            elif self.options.out:
                self._save_window(window)
        if kept is not None:
            self.last_kept = kept
        self.steps.append(
            OptimizerStep(
                index=len(self.steps),
                micro=one_batch_each(window.micro, window.parts),
                grad=kept.values if kept is not None else None,
                grad_norm=kept.norm if kept is not None else None,
                held=kept.held if kept is not None else None,
                not_comparable="; ".join(dict.fromkeys(reasons)) if window.armed else "",
            )
        )
        self._disarm()

    # --- events --------------------------------------------------------------------------------------

    def before_backward(self, loss: Any = None) -> None:
        window, pending = self.window, self.pending
        if window.armed:
            self.draws.check("the backward")
        loader, epoch = pending.handoffs[0][:2] if pending.handoffs else ("", 0)
        window.micro.append(
            MicroStep(
                loader=loader,
                epoch=epoch,
                batches=tuple(h[2] for h in pending.handoffs if h[:2] == (loader, epoch)),
                samples=pending.samples if pending.handoffs else -1,
                supervised=pending.supervised,
                forwards=tuple(sorted(pending.forwards.items())),
                draws=_marked(self.draws.take_loop_draws(), pending.draws_before) if window.armed else (),
                loss=_scalar(loss) if window.armed else None,
                feed=_feed(pending) if window.armed else None,
            )
        )
        window.parts.append(pending.parts)
        self.handed_log.append((window.micro[-1], pending.parts))
        window.kept = {}
        self.pending = _Pending()

    def before_clip(self) -> None:
        """Clipping starts: the gradient is final (DDP has averaged it); keep it as it is now."""
        window = self.window
        if not window.armed or not window.backwards or window.kept:
            return
        for optimizer in self.models.optimizers_alive():
            window.kept[id(optimizer)] = self.keeper.keep(optimizer_params(optimizer))

    def step_pre(self, optimizer: Any) -> None:
        self.stepping += 1
        if self.stepping == 1:
            self._close_window(optimizer)

    def step_post(self) -> None:
        self.stepping = max(0, self.stepping - 1)
        if self.stepping == 0:
            self._open_window()

    def main_fetch(self, states: dict[str, bytes | None]) -> None:
        if self.draws.armed:
            self.draws.explained(states)

    def _forward_pre(self, module: Any, args: Any) -> None:
        if self.in_backward:
            return
        self.depth += 1
        self.norms.calling.append(module)
        name = self.models.called(module, self.depth == 1)
        if name is not None and self.grad_enabled():
            self.pending.forwards[name] += 1

    def _forward_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        pending = self.pending
        if self.depth == 1 and not self.in_backward and pending.fed_tokens is None and self.grad_enabled():
            pending.fed_tokens = forward_tokens(module, args, kwargs or {})
        if not self.in_backward and self.depth > 0:
            self.depth -= 1
            if self.norms.calling:
                self.norms.calling.pop()

    # --- the replay ----------------------------------------------------------------------------------

    def _load_recorded(self, window: _Window) -> bool:
        if self._world_size() > 1:
            self.notes.append("a replay runs at world size 1; this run has more processes: nothing replayed")
            return False
        recorded = rp.read_window(self.options.replay, window.name, self.options.replay_ranks)
        if recorded is None:
            return False
        if self.options.twice:
            recorded = rp.twice(recorded)
        window.recorded = recorded
        window.matcher = DrawMatcher(
            recorded.ranks,
            [
                [RecordedDraw(call, value, _key(call, key)) for call, value, key in made]
                for made in recorded.draws
            ],
        )
        if self.draws.seq:
            early = self.draws.seq[0].draw
            window.reasons.append(
                f"{early.site} {early.call} draws before the step's first batch: not replayed"
            )
        self.draws.substitute = self._replay_draw
        if recorded.params is None:
            window.reasons.append(recorded.no_weights or "the recorded launch saved no weights for this step")
        else:
            reason = self.models.load(recorded.params, recorded.buffers)
            if reason:
                window.reasons.append(reason)
        return True

    def _substitute(self, window: _Window, handoff: Handoff, batch: Any) -> Any:
        recorded = window.recorded
        if recorded is None:
            return batch
        key = handoff_key(handoff)
        missing = [
            rank for rank, saved in zip(recorded.ranks, recorded.batches, strict=True) if key not in saved
        ]
        where = f"{handoff[0]} epoch {handoff[1]} batch {handoff[2]}"
        if missing:
            window.reasons.append(f"rank {missing[0]} saved no batch at {where}")
            return batch
        self.norms.handed(None)
        try:
            merged = rp.union([saved[key] for saved in recorded.batches], self.options.ignore_index)
        except NotReplayable as exc:
            window.reasons.append(f"the batch at {where} cannot be replayed: {exc}")
            return batch
        self.norms.handed([batch_samples(rp.from_plain(saved[key])) for saved in recorded.batches])
        return rp.from_plain(merged, batch)

    def _replay_draw(self, index: int, draw: Any, value: Any) -> Any:
        matcher = self.window.matcher
        if matcher is None:
            raise NotReplayable("drawn before the step's first batch")
        return matcher.substitute(draw, value)

    def _replay_mismatch(self, window: _Window) -> list[str]:
        recorded = window.recorded
        if recorded is None:
            return []
        out = []
        own = [handoff_key(h) for h in window.handoffs]
        for rank, handoffs in zip(recorded.ranks, recorded.handoffs, strict=True):
            if own != list(handoffs):
                out.append(
                    f"rank {rank} was handed {len(handoffs)} batches in this step, the replay {len(own)}"
                )
                break
        unmatched = window.matcher.unmatched() if window.matcher is not None else ""
        if unmatched:
            out.append(unmatched)
        for rank, notes in zip(recorded.ranks, recorded.notes, strict=True):
            out += [f"rank {rank} saved no {note}" for note in notes]
        return out

    # --- the ranks' records --------------------------------------------------------------------------

    def _save_batch(self, window: _Window, handoff: Handoff, batch: Any) -> None:
        try:
            window.batches[handoff_key(handoff)] = rp.to_plain(batch)
        except NotReplayable as exc:
            window.unsaved.append(f"the batch at {handoff[0]} epoch {handoff[1]} batch {handoff[2]}: {exc}")

    def _save_weights(self, window: _Window) -> None:
        """The weights at the window's first batch: rank 0's, or every rank's shard of sharded ones."""
        sharded = self.models.sharded()
        if not sharded and self._rank() != 0:
            return
        try:
            weights = self.models.weights()
        except Unreadable as exc:
            window.unsaved.append(f"weights: {exc}")
            return
        if weights is None:
            window.unsaved.append("weights: no optimizer was made before the step's first batch")
            return
        rank = self._rank() if sharded else None
        rp.save(params_path(self.options.out, window.name, rank), weights)

    def _save_window(self, window: _Window) -> None:
        if not window.name:
            return
        payload = {
            "handoffs": [handoff_key(h) for h in window.handoffs],
            "batches": window.batches,
            "draws": [
                [d.draw.call, _plain_draw(d.value, window), d.draw.stream, d.draw.state, list(d.draw.shape)]
                for d in self.draws.seq
            ],
            "notes": list(window.unsaved),
        }
        try:
            rp.save(os.path.join(step_rank_folder(self.options.out, self._rank()), window.name), payload)
        except Exception as exc:  # a value torch cannot save: the replay will say this step is missing
            self.notes.append(f"step {len(self.steps)} not saved for a replay: {type(exc).__name__}: {exc}")

    # --- where this process is -----------------------------------------------------------------------

    def _rank(self) -> int:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
        return int(os.environ.get("RANK", "0") or 0)

    def _world_size(self) -> int:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
        return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _key(call: str, saved: tuple[str, int, tuple[int, ...]] | None) -> Key | None:
    """A recorded draw's key (stream, state, call, shape); None where the record has none."""
    return (saved[0], saved[1], call, saved[2]) if saved is not None else None


def _plain_draw(value: Any, window: _Window) -> Any:
    try:
        return rp.to_plain(value)
    except NotReplayable as exc:
        window.unsaved.append(f"random draw's value: {exc}")
        return None


# --- what a batch holds ------------------------------------------------------------------------------------


def batch_samples(batch: Any) -> int:
    """Samples in a batch: a tensor's first dimension, a dict's ``input_ids``/first tensor, a
    collated tuple's first tensor, a list of samples' length; -1 unknown."""
    lead = _lead(batch)
    if lead is not None:
        return lead
    if isinstance(batch, Mapping) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        try:
            values = [batch["input_ids"]] if "input_ids" in batch else []
            values += [batch[k] for k in batch.keys()]  # noqa: SIM118
        except Exception:
            return -1
        for value in values:
            lead = _lead(value)
            if lead is not None:
                return lead
        return -1
    if isinstance(batch, (list, tuple)):
        for value in batch:
            lead = _lead(value)
            if lead is not None:
                return lead
        return len(batch) if isinstance(batch, list) else -1
    return -1


def _lead(value: Any) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype") and len(shape) >= 1:
        return int(shape[0])
    return None


def supervised(batch: Any, ignore_index: int = IGNORE_INDEX) -> int | None:
    """Labels that are not the ignore index (None: the batch carries no ``labels``)."""
    from ddpcheck.checker.work import token_view

    view = token_view(batch)
    if not (isinstance(view, Mapping) or hasattr(view, "keys")):
        return None
    try:
        labels = view.get("labels")
    except Exception:
        return None
    if labels is None or not hasattr(labels, "shape"):
        return None
    return int((labels != ignore_index).sum())


# --- installing --------------------------------------------------------------------------------------------

ACTIVE: StepWatcher | None = None


def active_watcher() -> StepWatcher | None:
    """The watcher installed in this process (None: the step is not watched)."""
    return ACTIVE


_installed = False


def install_watcher(options: StepOptions) -> StepWatcher:
    """Start watching this process's training step (before the script runs)."""
    global ACTIVE
    watcher = StepWatcher(options)
    _install()
    draws_module.install(watcher.draws)
    if options.fetch:
        under = step_folder(options.out) if options.out else ""
        watcher.fetch = rng.FetchWatch(
            on_main_fetch=watcher.main_fetch, under=under, wants_states=lambda: watcher.draws.armed
        )
        rng.install_fetch_watch(watcher.fetch)
    ACTIVE = watcher
    return watcher


def _scalar(loss: Any) -> float | None:
    """The value of a one-element loss tensor (None: several elements, or no tensor)."""
    import torch

    if isinstance(loss, (list, tuple)) and len(loss) == 1:
        loss = loss[0]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return None
    try:
        local, offsets = local_part(loss.detach())  # a DTensor loss (loss parallelism): replicated only
    except Unreadable:
        return None
    return float(local.float().cpu().reshape(())) if offsets is None else None


def _feed(pending: _Pending) -> ModelFeed | None:
    """The micro-step's tokens: the batch handed and what the model was given (None: neither holds any)."""
    fed = pending.fed_tokens or ()
    return ModelFeed(pending.handed_tokens, fed) if pending.handed_tokens or fed else None


def _marked(draws: tuple[Draw, ...], before: int) -> tuple[Draw, ...]:
    """The micro-step's loop draws, the first ``before`` marked as made before its batch arrived."""
    return tuple(replace(d, before_batch=True) if i < before else d for i, d in enumerate(draws))


def _install() -> None:
    global _installed
    if _installed:
        return
    import torch
    import torch.autograd
    import torch.nn.utils
    import torch.nn.utils.clip_grad
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim import Optimizer
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        watcher = ACTIVE
        if watcher is None or watcher.in_backward:
            return original_backward(*args, **kwargs)
        watcher.before_backward(args[0] if args else kwargs.get("tensors"))
        watcher.in_backward = True
        try:
            return original_backward(*args, **kwargs)
        finally:
            watcher.in_backward = False

    backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
    backward.__doc__ = original_backward.__doc__
    patching.replace(torch.autograd, "backward", backward)
    norms.install(_part_norm)
    patching.keep_handle(register_optimizer_step_pre_hook(lambda o, a, k: _call(lambda w: w.step_pre(o))))
    patching.keep_handle(register_optimizer_step_post_hook(lambda o, a, k: _call(lambda w: w.step_post())))
    made = _after(Optimizer.__init__, lambda w, o: w.models.optimizer_made(o))
    patching.replace(Optimizer, "__init__", made)
    patching.replace(
        DistributedDataParallel,
        "__init__",
        _after(DistributedDataParallel.__init__, lambda w, ddp: w.models.adopt(ddp.module)),
    )
    for module in (torch.nn.utils, torch.nn.utils.clip_grad):
        for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_"):
            original = module.__dict__.get(name)
            if original is not None:
                patching.replace(module, name, _before_clip(original))
    _installed = True


def uninstall() -> None:
    """Every patch the watcher made undone (a process that goes on after watching, such as a test)."""
    global _installed, ACTIVE
    if ACTIVE is not None:
        ACTIVE.finish()
    patching.undo()
    draws_module.forget_install()
    rng.forget_install()
    _installed = False


def _part_norm() -> PartNorm | None:
    """The batch norms' parts while a replay runs a compared step (None: normalise as is)."""
    watcher = ACTIVE
    if watcher is None or not watcher.options.replay or not watcher.window.armed:
        return None
    return watcher.norms


def _call(action: Callable[[StepWatcher], None]) -> None:
    watcher = ACTIVE
    if watcher is not None:
        action(watcher)


def _after(original: Callable[..., Any], action: Callable[[StepWatcher, Any], None]) -> Callable[..., Any]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        watcher = ACTIVE
        if watcher is not None:
            action(watcher, self)

    init.__wrapped__ = original  # type: ignore[attr-defined]
    init.__doc__ = original.__doc__
    return init


def _before_clip(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, "_ddpcheck_clip", False):
        return original

    def clip(*args: Any, **kwargs: Any) -> Any:
        watcher = ACTIVE
        if watcher is not None:
            watcher.before_clip()
        return original(*args, **kwargs)

    clip._ddpcheck_clip = True  # type: ignore[attr-defined]
    clip.__wrapped__ = original  # type: ignore[attr-defined]
    clip.__name__ = original.__name__
    clip.__doc__ = original.__doc__
    return clip
