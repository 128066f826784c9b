"""Which numbers a script reports are its evaluation's metrics, and how a printed one is read (issue 41).

Pure text rules, shared by the rank side (which reads the script's printed lines and logged keys as they
come) and ``metric_equivalence`` (which decides what it compares):

- a printed line is cut into its numbers and its template (the line with each number written ``{}``);
  clock times (``10:23:11``), dates and hexadecimal addresses are masked, never numbers;
- a number's label is the words since the number before it and the unit right after it ("val acc",
  "took|s"); a key's words are its parts (``eval_samples_per_second``: eval, samples, per, second);
- a value is left alone when one of those words names something that changes with the world size by
  design (:data:`LEFT_ALONE`): timings and throughput, learning rates, the world size and ranks, steps,
  epochs and batches, per-rank counts, memory, and anything of training; or when its label is a connector
  alone (the 2 of "rank 0 of 2", the 21 of "16/21": a count).

A printed or logged number is compared only where it reports a metric (:func:`reports_metric`). A printed
number's precision is one unit in its last printed digit (``0.8125``: 1e-4; ``1.5e-03``: 1e-4;
``812``: 1).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


def _words_of(*groups: str) -> frozenset[str]:
    return frozenset(word for group in groups for word in group.split())


LEFT_ALONE = _words_of(
    # timings and throughput
    "time times timing elapsed took duration runtime sec secs second seconds s ms us ns min mins minute "
    "minutes h hr hrs hour hours it its throughput speed fps eta remaining",
    # learning rates and optimisation of training
    "lr learning momentum wd decay grad grads gradient gradients train training",
    # the layout
    "rank ranks world size sizes gpu gpus device devices cuda node nodes proc procs process processes "
    "nproc worker workers pid port local",
    # where the run is
    "step steps global iter iters iteration iterations epoch epochs batch batches bs accum accumulation",
    # per-rank counts
    "count counts num n samples sample examples example items item images tokens token sequences seqs "
    "len length shard",
    # memory
    "mem memory mb gb gib mib kb bytes alloc allocated reserved",
    # neither a value nor a metric
    "seed version",
)

_MASKED = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?\b"  # dates (and their times)
    r"|\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\b"  # clock times, durations h:mm:ss
    r"|\b0x[0-9a-fA-F]+\b"  # addresses
)
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF))"
    r"(?P<unit>[A-Za-z%]+(?:/[A-Za-z]+)?)?"
)
_AFTER = re.compile(r"\s?(?P<word>[A-Za-z%]+(?:/[A-Za-z]+)?)")
_WORDS = re.compile(r"[A-Za-z]+")
MASK = "<>"  # what a masked time, date or address reads as in a template


@dataclass(frozen=True)
class PrintedNumber:
    """One number of a printed line: as printed, its value, one unit in its last digit, its label."""

    shown: str
    value: float
    unit: float
    label: str  # words before it, "|", the unit after it


def words(text: str) -> list[str]:
    """The lower-case words of a key or a label (``eval_samplesPerSecond``: eval, samples, per, second)."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return [w.lower() for w in _WORDS.findall(spaced)]


# a line led by one of these reports an evaluation
EVALUATION = _words_of("val valid validation eval evaluation evaluate evaluating test testing dev heldout")
METRICS = EVALUATION | _words_of(  # a number labelled by one of these is a metric
    "acc accuracy top f precision prec recall auc auroc roc ap map iou miou dice bleu rouge wer cer ppl "
    "perplexity mse mae rmse error err metric metrics score correct exact em matthews mcc kappa jaccard "
    "ndcg mrr hit hits"
)
CONNECTORS = frozenset({"of", "out", "from", "in"})  # "rank 0 of 2", "16/21" (read as "of"): a count


def left_alone(text: str) -> str:
    """The word of a key or label that says the value changes with the world size by design ("": none): one
    of :data:`LEFT_ALONE`, or a label of connectors alone (the count after "of" or "/")."""
    found = words(text)
    named = next((w for w in found if w in LEFT_ALONE), "")
    if named or not found or not all(w in CONNECTORS for w in found):
        return named
    return found[0]


def reports_metric(label: str, template: str) -> bool:
    """A printed (or logged) number reports a metric: its label names one ("val acc", "accuracy"), the
    line is led by an evaluation word ("val epoch 3: acc 0.81, loss 0.44"), or the number stands bare
    ("0.8125", "epoch 3: 0.8125"). A number labelled otherwise ("loss 0.44" beside "val_acc 0.81") may be
    a training value printed with the evaluation's: it is not compared."""
    said = words(label.split("|")[0])
    if any(w in METRICS for w in said) or not said:
        return True
    lead = template.split("{}", 1)[0]
    return any(w in EVALUATION for w in words(lead))


def unit_of(shown: str) -> float:
    """One unit in the last printed digit of ``shown`` (0.0 for nan and inf)."""
    text = shown.lstrip("+-").lower()
    if text in ("nan", "inf"):
        return 0.0
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** ((int(exponent) if exponent else 0) - decimals)


def read_line(line: str) -> tuple[str, list[PrintedNumber]]:
    """A printed line's template (each number ``{}``, masked tokens ``<>``) and its numbers, in order."""
    masked = _MASKED.sub(MASK, line.rstrip())
    template: list[str] = []
    found: list[PrintedNumber] = []
    at = 0
    for match in _NUMBER.finditer(masked):
        shown, unit = match.group("num"), match.group("unit") or ""
        before = masked[at : match.start()]
        if not unit:
            after = _AFTER.match(masked, match.end())
            unit = after.group("word") if after is not None and after.group("word") in _UNITS else ""
        try:
            value = float(shown)
        except ValueError:  # pragma: no cover - the pattern reads only what float() does
            continue
        said = "of" if before.rstrip().endswith("/") else " ".join(words(before))
        label = said + "|" + unit
        found.append(PrintedNumber(shown, value, unit_of(shown), label))
        template.append(before + "{}" + (match.group("unit") or ""))
        at = match.end()
    template.append(masked[at:])
    return "".join(template), found


_UNITS = frozenset(
    {"s", "ms", "us", "ns", "sec", "secs", "second", "seconds", "min", "mins", "minutes", "h", "hours",
     "it/s", "s/it", "samples/s", "tokens/s", "MB", "GB", "GiB", "MiB", "kB", "samples", "tokens",
     "examples", "images", "items", "steps", "batches", "epochs"}
)  # fmt: skip


def close(a: float, b: float, unit: float = 0.0, *, rel: float, absolute: float) -> bool:
    """``a`` and ``b`` equal within float noise (``rel`` of the larger, at least ``absolute``) plus one
    printed ``unit``; both NaN are equal, one NaN is not; infinities equal only themselves."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= max(absolute, rel * max(abs(a), abs(b))) + unit
