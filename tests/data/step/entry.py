"""Test harness: run a training script under the step watcher as the script recorder will.

``python entry.py --out DIR [--replay DIR] [--compare N] -- SCRIPT ARGS``: installs the watcher, wraps
``DataLoader.__iter__`` minimally (every batch goes through ``watcher.handed``; the epoch's fetch draws
are taken when its iterator ends), runs the script as ``__main__`` and pickles the StepTrace with the
fetch draws to ``DIR/rank<R>.steps``. Tests only: the real recorder is ``ddpcheck.checker.script``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import runpy
import sys
from collections.abc import Iterator
from typing import Any


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--replay", default="")
    parser.add_argument("--compare", type=int, default=None)
    args = parser.parse_args(argv[:cut])
    script = argv[cut + 1 :]

    from torch.utils.data import DataLoader

    from ddpcheck.checker.step import StepOptions, install_watcher

    saving = "" if args.replay else args.out
    watcher = install_watcher(StepOptions(out=saving, replay=args.replay, compare_batches=args.compare))
    original = DataLoader.__iter__
    names: dict[int, str] = {}
    epochs: dict[str, int] = {}
    fetches: dict[str, list[Any]] = {}

    def __iter__(self: Any) -> Iterator[Any]:
        name = names.setdefault(id(self), f"loader{len(names)}")
        epoch = epochs[name] = epochs.get(name, -1) + 1

        def batches() -> Iterator[Any]:
            try:
                for position, batch in enumerate(original(self)):
                    yield watcher.handed(name, epoch, position, batch)
            finally:
                fetches.setdefault(name, []).append(watcher.fetch_draws(self))

        return batches()

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    sys.argv = script
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
    try:
        runpy.run_path(script[0], run_name="__main__")
    finally:
        rank = int(os.environ.get("RANK", "0"))
        trace = watcher.finish()
        with open(os.path.join(args.out, f"rank{rank}.steps"), "wb") as handle:
            pickle.dump({"steps": trace, "fetches": fetches}, handle)


if __name__ == "__main__":
    main()
