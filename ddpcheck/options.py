"""What a ddpcheck run is asked to do: plain options, validated before anything starts.

Plain data below every layer that reads them: the front ends build them, the session and the scenarios
(metric, training, resume) read them, and the rank side receives what it needs of them as typed values
(:func:`ddpcheck.checker.recipe.record_options`); nothing here launches or judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpcheck.layout import MAX_SIMULATED_RANKS, Layout, LayoutError, MeshLike, parse_meshes
from ddpcheck.verdict import ALL_CHECKS

BACKENDS = ("gloo", "nccl")
MAX_EPOCHS = 10_000
MAX_TIMEOUT = 7 * 24 * 3600.0  # one week
MAX_COUNT = 2**31 - 1  # steps, batch size: what a C int holds
MAX_TRAIN_STEPS = 100_000
MAX_WORKERS = 512  # DataLoader workers a resume may be restored into
WORLD_SIZES = (1, 2, 3, 4)  # the command's world sizes (and CheckOptions'), when none are given
TEST_WORLD_SIZES = (1, 2)  # a check from inside a test suite (the pytest plugin, check_script): quick
IGNORE_INDEX = -100  # the label value that supervises nothing (--ignore-index; cross_entropy's default)


class BadInput(ValueError):
    """Options or inputs that make the run impossible; the message is one actionable line (exit 2).

    ``option``: the :class:`CheckOptions` field at fault, where one is (the command line then says
    where its value came from: a flag, ``[tool.ddpcheck]`` or a ``DDPCHECK_*`` variable).
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class CheckOptions:
    """What one ddpcheck run is asked to do: world sizes and meshes, epochs, how the loader is built, which
    checks and scenarios run and how strictly. Plain values with the command line's defaults, checked
    when made (every rule, one message each: :class:`BadInput` naming the field), as attrs validates at
    construction; ``meshes`` may be given as specs, mappings or Layouts and holds Layouts from then on
    (:attr:`layouts`), ``data_dims`` and ``sequence_dims`` applied.

    Each front end (the command, the pytest marker, ``ddpcheck.check``) builds one and passes it on; the
    rank side receives what it needs as typed values made from it once
    (:func:`ddpcheck.checker.recipe.record_options` for a data run,
    :meth:`ddpcheck.checker.recipe.LoaderRecipe.from_options` for how a loader is built), never a copy
    made field by field. ``option_sources`` and ``config_file`` say where the values came from (the
    report lists them). The live display's callback is no option of the run: it is given to
    :func:`ddpcheck.session.check_loader` beside them."""

    world_sizes: tuple[int, ...] = WORLD_SIZES
    epochs: int = 2
    backend: str = "gloo"
    factory: str = "make_loader"
    patch: bool = False
    simulate: bool = False
    load_data: bool = False
    set_epoch: bool = True
    timeout: float = 120.0  # seconds a rank may go without progress (a batch, an epoch, a collective)
    max_time: float | None = None  # seconds a process group may run in all; None: no cap
    determinism: bool = True
    batch_size: int | None = None
    # --- metric and training equivalence (ddpcheck.evaluate, ddpcheck.training) ---
    metrics: bool | None = None  # None: when the file defines forward or metric
    metric_tolerance: float | None = None  # None: exact for integers, relative 1e-6 for floats
    train_steps: int = 3  # 0: off; runs when the file defines make_model and loss
    # --- windows, allowed failures, resume ---
    steps: int | None = None  # per rank per epoch window; None: whole epochs
    allow: tuple[str, ...] = ()  # check ids whose failure is reported as "allowed"
    ids_from_data: bool = False  # set by the runner when rank-local indices cannot identify samples
    factory_args: tuple[tuple[str, Any], ...] = ()  # --factory-arg KEY=VALUE, passed to the factory
    preload: bool = True  # import the file's third-party modules once, before ranks are forked
    resume: bool = True  # the mid-epoch resume check, where the loader has a state mechanism
    elastic: bool = False  # also restore at other world sizes and meshes
    resume_workers: tuple[int, ...] = ()  # also restore into loaders rebuilt with these numbers of workers
    dcp: bool = False  # save and load the data state with torch.distributed.checkpoint (a Stateful)
    # --- work balance and packing (ddpcheck.checker.work, ddpcheck.checks.work) ---
    work: bool = True  # measure each batch's work when batches carry tokens (the data is then loaded)
    work_cost: str = "tokens"  # "tokens" | "attention": each document's length squared
    max_idle: float | None = None  # fail work_balance when a layout's idle fraction exceeds this
    mixture: bool = True  # read each sample's source where batches carry one (ddpcheck.checker.mixture)
    # --- device meshes: each spec a layout beside the world sizes (ddpcheck.layout) ---
    meshes: tuple[MeshLike, ...] = ()  # "dp=2,tp=2", {"dp": 2, "tp": 2} or a Layout, outermost first
    data_dims: tuple[str, ...] = ()  # the dimensions that split the data; () = the names starting with dp
    sequence_dims: tuple[str, ...] | None = None  # ...that slice every sequence; None = names starting sp
    # --- where the values came from (the command line's layers): reported, never read by a check ---
    option_sources: dict[str, str] = field(default_factory=dict)  # field -> "default", "command line", ...
    config_file: str | None = None  # the file whose [tool.ddpcheck] table gave defaults

    def __post_init__(self) -> None:
        object.__setattr__(self, "meshes", _parsed_meshes(self))
        _check(self)

    @property
    def layouts(self) -> tuple[Layout, ...]:
        """The meshes asked for, as parsed when the options were made."""
        return self.meshes  # type: ignore[return-value]  # Layouts since __post_init__


def mesh_layouts(options: CheckOptions) -> list[Layout]:
    """The run's meshes as layouts: :attr:`CheckOptions.layouts`, parsed when the options were made.
    Kept for the two readers not moved to the attribute yet (``session/script.py``, ``cli_run.py``)."""
    return list(options.layouts)


def validate(options: CheckOptions) -> CheckOptions:
    """The options, valid: :class:`CheckOptions` checks every rule when it is made (and remade by
    ``dataclasses.replace``), so this returns them as they are. Kept for the readers named at
    :func:`mesh_layouts`."""
    return options


def _number(value: object, kind: type | tuple[type, ...] = (int, float)) -> bool:
    """A real number of ``kind`` (a bool is no number here)."""
    return isinstance(value, kind) and not isinstance(value, bool)


def _integer(value: object, low: int, high: int, what: str, option: str) -> None:
    if not _number(value, int) or not low <= value <= high:  # type: ignore[operator]
        raise BadInput(f"{what} must be from {low} to {high}, got {value!r}", option)


def _parsed_meshes(options: CheckOptions) -> tuple[Layout, ...]:
    """``options.meshes`` through the one parser (:func:`ddpcheck.layout.parse_meshes`), ``data_dims`` and
    ``sequence_dims`` applied; a Layout given parses to itself. BadInput for a spec that describes no
    ranks."""
    meshes = options.meshes
    if (options.data_dims or options.sequence_dims) and not meshes:
        raise BadInput("--data-dims and --sequence-dims name mesh dimensions: give --mesh too", "data_dims")
    try:
        return tuple(parse_meshes(meshes, tuple(options.data_dims), options.sequence_dims))
    except LayoutError as exc:
        raise BadInput(str(exc), "meshes") from None


def _check(options: CheckOptions) -> None:
    """Every rule on the options but the meshes' (one message each, BadInput naming the field)."""
    meshes = options.meshes
    if not options.world_sizes and not meshes:
        raise BadInput("no world sizes or meshes given", "world_sizes")
    for ws in options.world_sizes:
        if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
            raise BadInput(f"world sizes must be positive integers, got {ws!r}", "world_sizes")
        if ws > MAX_SIMULATED_RANKS:
            raise BadInput(
                f"world sizes must be at most {MAX_SIMULATED_RANKS} (simulated ranks), got {ws}",
                "world_sizes",
            )
    _integer(options.epochs, 1, MAX_EPOCHS, "epochs", "epochs")
    for name in ("timeout", "max_time"):
        seconds = getattr(options, name)
        if name == "max_time" and seconds is None:
            continue
        if not _number(seconds) or not 0 < seconds <= MAX_TIMEOUT:
            raise BadInput(
                f"{name.replace('_', ' ')} must be positive and at most {MAX_TIMEOUT:.0f} seconds (one "
                f"week), got {seconds!r}",
                name,
            )
    if options.backend not in BACKENDS:
        raise BadInput(f"unknown backend {options.backend!r}; choose one of {', '.join(BACKENDS)}", "backend")
    if options.backend == "nccl" and not options.simulate:
        import torch

        if not torch.cuda.is_available():
            raise BadInput(
                "backend nccl needs CUDA, and this machine has no CUDA device; use --backend gloo", "backend"
            )
    if options.batch_size is not None:
        _integer(options.batch_size, 1, MAX_COUNT, "batch size", "batch_size")
    if options.steps is not None:
        _integer(options.steps, 1, MAX_COUNT, "steps", "steps")
    steps = options.train_steps
    if not _number(steps, int) or not 0 <= steps <= MAX_TRAIN_STEPS:  # type: ignore[operator]
        raise BadInput(
            f"train steps must be a non-negative integer up to {MAX_TRAIN_STEPS} (0 turns it off), "
            f"got {steps!r}",
            "train_steps",
        )
    tolerance = options.metric_tolerance
    if tolerance is not None and not (_number(tolerance) and 0 <= tolerance < float("inf")):
        raise BadInput(
            f"metric tolerance must be a non-negative number, got {tolerance!r}", "metric_tolerance"
        )
    workers = options.resume_workers
    if not isinstance(workers, tuple) or any(
        not _number(n, int) or not 0 <= n <= MAX_WORKERS for n in workers
    ):
        raise BadInput(
            f"resume workers must be numbers of DataLoader workers from 0 to {MAX_WORKERS}, got {workers!r}",
            "resume_workers",
        )
    if options.work_cost not in ("tokens", "attention"):
        raise BadInput(f"work cost must be tokens or attention, got {options.work_cost!r}", "work_cost")
    idle = options.max_idle
    if idle is not None and not (_number(idle) and 0 <= idle < 1):
        raise BadInput(
            f"max idle must be a fraction at least 0 and below 1 (e.g. 0.2), got {idle!r}", "max_idle"
        )
    unknown = sorted(set(options.allow) - set(ALL_CHECKS))
    if unknown:
        raise BadInput(
            f"unknown check id for --allow: {', '.join(unknown)}; choose from {', '.join(ALL_CHECKS)}",
            "allow",
        )
