"""Writing reports to disk atomically, so a CI artifact is never a half-written file.

Each file goes to a temporary sibling, is fsynced and then moved into place with ``os.replace``:
a reader sees either the previous report or the complete new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path

from ddpcheck.report.dispatch import render
from ddpcheck.report.formats import check_format
from ddpcheck.report.markdown import picture_names, render_markdown
from ddpcheck.report.view import ReportView, build_view
from ddpcheck.result import CheckResult

SUFFIXES = {"json": ".json", "markdown": ".md", "table": ".txt", "junit": ".xml", "html": ".html"}


class ReportWriteError(OSError):
    """A report directory could not be created or a report file could not be written there."""


def write_reports(
    result: CheckResult,
    report_dir: Path,
    *,
    stem: str = "ddpcheck",
    junit_path: Path | None = None,
    formats: Iterable[str] = ("json", "markdown", "html"),
) -> list[Path]:
    """Write ``<stem>.json`` / ``.md`` / ``.txt`` / ``.xml`` / ``.html`` for ``formats`` (and JUnit at
    ``junit_path``).

    With Markdown, the pictures it links are written next to it as ``<stem>-ws2-samples.svg`` etc., and
    pictures of an earlier run that this one does not draw again are removed. The files are one set:
    every file is rendered before the first is written (a rendering bug cannot leave a mixed set
    behind), and they are written while this process holds the report directory's lock, so two runs
    writing the same directory at once leave one run's set, not a mix. Returns the report paths in
    order (not the pictures); raises :class:`ReportWriteError` on I/O failure.
    """
    names = [formats] if isinstance(formats, str) else list(formats)
    chosen = [check_format(fmt) for fmt in dict.fromkeys(names)]
    printed_only = [fmt for fmt in chosen if fmt not in SUFFIXES]
    if printed_only:
        raise ValueError(f"{printed_only[0]} is printed, not written to a file; files: {', '.join(SUFFIXES)}")
    if not isinstance(stem, str) or not stem or stem in (".", "..") or "/" in stem or os.sep in stem:
        raise ValueError(f"stem must be a plain file name such as 'ddpcheck', not {stem!r}")
    report_dir = Path(report_dir)
    targets = [(report_dir / f"{stem}{SUFFIXES[fmt]}", fmt) for fmt in chosen]
    if junit_path is not None:
        targets = [(path, fmt) for path, fmt in targets if fmt != "junit"]
        targets.append((Path(junit_path), "junit"))
    view = build_view(result)
    rendered = [(path, _render(view, fmt, stem)) for path, fmt in targets]
    extra = []
    if "markdown" in chosen:
        extra = [(report_dir / item.name, item.picture.svg) for item in picture_names(view, stem)]
    _make_dir(report_dir)
    with _locked(report_dir):
        for path, text in [*rendered, *extra]:
            write_atomic(path, text)
        if "markdown" in chosen:
            _remove_stale_pictures(report_dir, stem, {path.name for path, _ in extra})
    return [path for path, _ in rendered]


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _error(directory, exc) from exc


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on the directory itself (flock on its descriptor: no lock file to leave
    behind), held while one run's set of files goes in. Best effort where directories cannot be locked."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove_stale_pictures(directory: Path, stem: str, written: set[str]) -> None:
    """``<stem>-*.svg`` that an earlier run drew and this one did not (a layout it did not check)."""
    for path in directory.glob(f"{glob.escape(stem)}-*.svg"):
        if path.name not in written:
            with contextlib.suppress(OSError):
                path.unlink()


def _render(result: ReportView, fmt: str, stem: str) -> str:
    if fmt == "markdown":
        return render_markdown(result, figure_stem=stem)
    return render(result, check_format(fmt))


def _error(directory: Path, exc: OSError, what: str = "") -> ReportWriteError:
    reason = exc.strerror or str(exc)
    error = ReportWriteError(f"cannot write reports to {directory}: {what}{reason}")
    error.errno = exc.errno
    return error


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8, newline-terminated) to ``path`` via temp file + fsync + ``os.replace``."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _error(directory, exc) from exc
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "backslashreplace")
    temp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise _error(directory, exc) from exc
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise _error(directory, exc, f"{path.name}: ") from exc
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable where the platform allows it (best effort)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def reasons_path(paths: Iterable[Path]) -> str:
    """Where the terminal says the reasons checks do not apply are (the Markdown report): relative to the
    working directory when below it, else its name alone when the whole path would not fit a line
    (stderr's ``reports:`` line has it whole)."""
    path = next((p for p in paths if p.suffix == ".md"), None)
    if path is None:
        return "the report files"
    try:
        relative = os.path.relpath(path)
    except ValueError:
        relative = str(path)
    shown = str(path) if relative.startswith("..") else relative
    return shown if len(shown) <= 40 else f"{path.name} (in the report directory)"
