"""The rank side of ``mixture``: which source each sample came from, as plain numbers.

Mixtures (several sources drawn with weights) break under DDP and DataLoader workers in ways the
sample checks cannot see: every sample may still be seen once. So each rank reads the source of every
sample as its batches pass, and keeps per epoch one small code per sample (``array('h')``, parallel to
the ids) plus the source names: the checks (``ddpcheck.checks.mixture``) count shares per rank, per
worker (``EpochTrace.worker_ids`` says which worker made each batch) and for the union of the ranks.

The source of a batch's samples, in this order: the file's ``sample_source(batch)`` hook (one value per
sample); a ``source`` field of dict batches (a list of names, or a tensor of codes). The declared
weights come from the file's ``source_weights()`` hook (a dict name -> weight), read once per rank.
Where neither gives a source, nothing is kept and the check says so (n/a). A map-style dataset is only
loaded for this when the hook exists or its first sample carries a ``source`` field; otherwise its ids
still come from the sampler alone.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from typing import Any

from ddpcheck.checker.loaderfile import BadLoaderFile, optional_hook
from ddpcheck.trace import SourceCodes

SOURCE_HOOK = "sample_source"
WEIGHTS_HOOK = "source_weights"
SOURCE_FIELD = "source"
MAX_SOURCES = 32_000  # codes are int16


class SourceReader:
    """Reads the source of every sample of a batch; decides from the first batch whether there are any.

    ``state``: "" until the first batch, "hook" / "field" when batches carry a source, "none" when they
    do not (then every later batch costs one attribute check)."""

    def __init__(self, hook: Callable[[Any], Any] | None, declared: tuple[tuple[str, float], ...]) -> None:
        self.hook = hook
        self.declared = declared
        self.state = ""
        self.codes = array("h")
        self._index: dict[Any, int] = {}
        self.names: list[str] = []
        for name, _ in declared:
            self._code(name)

    def _code(self, name: str) -> int:
        code = self._index.get(name)
        if code is None:
            if len(self.names) >= MAX_SOURCES:
                raise BadLoaderFile(f"more than {MAX_SOURCES} distinct sources: sample_source names sources")
            code = self._index[name] = len(self.names)
            self.names.append(name)
        return code

    def read(self, batch: Any, size: int) -> None:
        """Append the codes of ``batch``'s ``size`` samples (nothing once batches are known to carry none)."""
        if self.state == "none":
            return
        values = self.hook(batch) if self.hook is not None else _field(batch)
        if values is None:
            if self.state == "":
                self.state = "none"
                return
            raise BadLoaderFile("a batch without a source field after batches with one")
        self.state = self.state or ("hook" if self.hook is not None else "field")
        names = _names(values)
        if len(names) != size:
            what = f"{SOURCE_HOOK}(batch)" if self.hook is not None else f"the batch's {SOURCE_FIELD!r} field"
            raise BadLoaderFile(f"{what} gave {len(names)} sources for a batch of {size} samples")
        index = self._index
        codes = [index.get(n) for n in names]
        if None in codes:
            codes = [self._code(n) for n in names]
        self.codes.extend(codes)  # type: ignore[arg-type]

    def tap(self, batch: Any, ids: list[Any]) -> list[Any]:
        """Read ``batch``'s sources on the way past; returns its ``ids`` unchanged."""
        self.read(batch, len(ids))
        return ids

    def take(self) -> SourceCodes | None:
        """The epoch's codes (None when batches carry no source), and a fresh buffer for the next."""
        if self.state in ("", "none"):
            self.codes = array("h")
            return None
        codes, self.codes = self.codes, array("h")
        return SourceCodes(tuple(self.names), codes, self.declared)


def _field(batch: Any) -> Any:
    if isinstance(batch, Mapping) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        try:
            return batch[SOURCE_FIELD] if SOURCE_FIELD in batch.keys() else None  # noqa: SIM118
        except Exception:
            return None
    return None


def _names(values: Any) -> list[str]:
    """One name per sample: strings as they are, numbers (a tensor of codes) as their text."""
    if isinstance(values, (str, bytes, int)):
        values = [values]
    elif hasattr(values, "tolist"):
        values = values.tolist()
        if not isinstance(values, list):
            values = [values]
    return [v if isinstance(v, str) else v.decode() if isinstance(v, bytes) else str(v) for v in values]


def declared_weights(module: Any) -> tuple[tuple[str, float], ...]:
    """The file's ``source_weights()`` as ``(name, weight)`` pairs; () when it defines none."""
    hook = optional_hook(module, WEIGHTS_HOOK)
    if hook is None:
        return ()
    weights = hook()
    if not isinstance(weights, Mapping) or not weights:
        raise BadLoaderFile(f"{WEIGHTS_HOOK}() must return a dict of source name -> weight, got {weights!r}")
    out = []
    for name, weight in weights.items():
        value = float(weight)
        if not value >= 0 or value == float("inf"):
            raise BadLoaderFile(f"{WEIGHTS_HOOK}() gave source {name!r} the weight {weight!r}")
        out.append((_names([name])[0], value))
    if sum(w for _, w in out) <= 0:
        raise BadLoaderFile(f"{WEIGHTS_HOOK}() gave every source the weight 0")
    return tuple(out)


def source_reader(module: Any, loader: Any, enabled: bool, peek: Callable[[Any], Any]) -> SourceReader | None:
    """A reader when this loader's samples may carry a source: the file has ``sample_source``, the
    dataset is iterable (it is iterated anyway: decided by its first batch), or the first sample of a
    map-style dataset (read by ``peek``, every random state put back) has a ``source`` field."""
    if not enabled:
        return None
    hook = optional_hook(module, SOURCE_HOOK)
    from torch.utils.data import IterableDataset

    dataset = getattr(loader, "dataset", None)
    iterable = isinstance(dataset, IterableDataset)  # some (litdata's) have __getitem__ too: iterated anyway
    map_style = not iterable and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    if hook is None and map_style and _field(peek(dataset)) is None:
        return None
    return SourceReader(hook, declared_weights(module))
