"""Every run ddpcheck starts sees the working directory as the user left it, and leaves it so.

A training script may write into its working directory and read it back when it starts again (minGPT's
``gpt_snapshot.pt``, an ``output_dir``, ``--resume auto``): the single-process run would change what the
next run starts from, and the user's directory would keep what ddpcheck's runs wrote. So each run gets its
own view of the directory, chosen by ``DDPCHECK_WORKDIR``:

- ``overlay``: a private mount namespace with an overlayfs on the directory itself (:mod:`.mountns`):
  the same paths, every write kept apart, the user's directory never written (Linux, as root or with
  user namespaces).
- ``view``: a folder of links to the directory's entries, and Python's file-changing calls made to act
  on it (:mod:`.view`); what reaches the user's directory anyway is found by comparing it before and
  after each run, and reported.
- ``off``: the user's directory itself, as before.

``auto`` (the default) takes ``overlay`` where it can be had, else ``view``, and says why. After each run
what the script wrote is listed; :meth:`WorkdirGuard.notes` says it in the report. The rank side
(:func:`enter_workdir`) runs first thing in a rank: this module and the two it uses import only the
standard library (and :mod:`.procs`), so no thread exists yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ddpcheck.launch import mountns, view
from ddpcheck.launch.procs import Janitor, kill_group, reap, remove_tree
from ddpcheck.messages import count_text

WORKDIR_ENV = "DDPCHECK_WORKDIR"  # auto | overlay | view | off
RANK_ENV = "DDPCHECK_WORKDIR_RANK"  # what a rank enters (JSON), set by the launcher
MODES = ("auto", "overlay", "view", "off")
HOLDER_TIMEOUT_S = 30.0  # a loaded machine may take seconds to start an interpreter
SCAN_LIMIT = 200_000  # entries of the user's directory compared in view mode
SHOWN = 4  # paths a note names


class WorkdirUnavailable(Exception):
    """The mode asked for (``DDPCHECK_WORKDIR=overlay``) cannot be had here; the message says why."""


class Janitorial(Protocol):
    """What a run needs of :class:`~ddpcheck.launch.procs.Janitor`: its leftovers go if ddpcheck dies."""

    def watch(self, pid: int) -> None: ...

    def remove(self, path: str) -> None: ...


@dataclass(frozen=True)
class Change:
    """One path the script wrote (created or changed) or deleted; a new folder is one change."""

    kind: str  # "wrote" | "deleted"
    path: str  # relative to the working directory; a folder ends with "/"
    size: int = 0  # bytes (of every file in a folder)
    files: int = 0  # files in a new folder


@dataclass
class RunWorkdir:
    """One run's view: where its ranks start, what they are told, and what goes afterwards."""

    label: str
    mode: str  # "overlay" | "view" | "off"
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    temp: str = ""
    layers: list[tuple[str, str]] = field(default_factory=list)  # (lower, upper) of each overlay
    holder: subprocess.Popen[bytes] | None = None


def mode_from_env(value: str | None = None) -> str:
    """``DDPCHECK_WORKDIR`` (or ``value``), checked; raises ValueError with a one-line reason."""
    mode = (os.environ.get(WORKDIR_ENV, "") if value is None else value).strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{WORKDIR_ENV}={mode!r}: use one of {', '.join(MODES)}")
    return mode


class WorkdirGuard:
    """The working directory of one ddpcheck session's runs (see the module docstring).

    ``own``: ddpcheck's own folders (traces, stacks): where they lie inside the directory they stay the
    real ones, so what the ranks write there reaches ddpcheck; and they go if ddpcheck dies."""

    def __init__(self, cwd: str, own: Sequence[str] = (), mode: str | None = None) -> None:
        self.given = cwd
        self.cwd = os.path.realpath(cwd)
        self.own = [os.path.realpath(path) for path in own]
        self.mode = mode_from_env(mode)
        self.why = ""  # why a view stands in for the overlay
        self.base = ""  # the temp folder the overlays' upper folders are made in, once one worked
        self.state: dict[str, tuple[int, int, int]] | None = None  # the directory as last seen (view)
        self.written: list[tuple[str, str, tuple[Change, ...]]] = []  # (label, how, changes)

    # --- a run ---------------------------------------------------------------------------------------

    def ready(self) -> None:
        """Where the overlay is asked for by name, make sure it can be had before any run starts (one
        holder started and ended); raises WorkdirUnavailable with the reason."""
        if self.mode != "overlay":
            return
        folder = tempfile.mkdtemp(prefix="ddpchk-probe-")
        janitor = Janitor(folder)
        try:
            self.finish(self.start("", janitor))
        finally:
            janitor.close()
            remove_tree(folder)

    def start(self, label: str, janitor: Janitorial) -> RunWorkdir:
        """Make run ``label``'s view; its leftovers (and ddpcheck's own folders) are the janitor's if
        ddpcheck dies."""
        for path in self.own:
            janitor.remove(path)
        if self.mode in ("auto", "overlay"):
            run = self._overlay(label, janitor)
            if run is not None:
                return run
        if self.mode == "view":
            return self._view(label, janitor)
        return RunWorkdir(label, "off", self.given)

    def finish(self, run: RunWorkdir) -> None:
        """Once every rank of ``run`` has ended: list what it wrote, end its holder, remove its folders."""
        try:
            if run.holder is not None:
                _stop(run.holder)
            if run.mode == "overlay":
                changes = [c for lower, upper in run.layers for c in upper_changes(upper, lower, self.cwd)]
                self.written.append((run.label, "overlay", tuple(changes)))
            elif run.mode == "view":
                self.written.append((run.label, "view", tuple(view_changes(run.cwd, self.cwd))))
                now = self._scan()
                if self.state is not None and now is not None:
                    self.written.append((run.label, "leaked", tuple(compare(self.state, now))))
                self.state = now
        except OSError:  # a listing that fails costs its note, never the run
            pass
        finally:
            if run.temp:
                remove_tree(run.temp)

    def _overlay(self, label: str, janitor: Janitorial) -> RunWorkdir | None:
        why = ""
        for base in [self.base] if self.base else self._bases():
            try:
                run = self._start_overlay(label, base, janitor)
            except OSError as exc:
                why = why or _first_line(str(exc)) or type(exc).__name__
                if "mount overlay" in str(exc):
                    continue  # this temp folder's filesystem cannot be an upper layer: try the next
                break
            self.base = base
            return run
        why = why or "no temp folder lies outside the working directory"
        if self.mode == "overlay":
            raise WorkdirUnavailable(f"{WORKDIR_ENV}=overlay: no private view of {self.cwd}: {why}")
        self.mode, self.why = "view", why
        return None

    def _bases(self) -> list[str]:
        """Temp folders an upper layer may live in: outside the directory, writable, no comma or colon
        (overlayfs options)."""
        found = []
        for base in (tempfile.gettempdir(), "/var/tmp", "/dev/shm"):
            real = os.path.realpath(base)
            if (
                real not in found
                and os.path.isdir(real)
                and os.access(real, os.W_OK)
                and not _inside(real, self.cwd)
                and not any(c in real for c in ",:\\")
            ):
                found.append(real)
        return found

    def _start_overlay(self, label: str, base: str, janitor: Janitorial) -> RunWorkdir:
        if sys.platform != "linux":
            raise OSError(f"mount namespaces are Linux's ({sys.platform} here)")
        targets = [self.cwd, *submounts(self.cwd)]
        temp = tempfile.mkdtemp(prefix="ddpchk-ov-", dir=base)
        janitor.remove(temp)
        holder: subprocess.Popen[bytes] | None = None
        try:
            layers = []
            for i, target in enumerate(targets):
                upper, work = os.path.join(temp, f"u{i}"), os.path.join(temp, f"w{i}")
                os.mkdir(upper)
                os.mkdir(work)
                layers.append([target, upper, work])
            keep = [path for path in self.own if _inside(path, self.cwd)]
            spec = json.dumps({"layers": layers, "keep": keep})
            holder = subprocess.Popen(  # the file itself, isolated, without site: a bare interpreter
                [sys.executable, "-I", "-S", mountns.__file__, spec],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,  # a Ctrl-C in the terminal is ddpcheck's to handle
            )
            janitor.watch(holder.pid)
            answer = _answer(holder, HOLDER_TIMEOUT_S)
            if not answer.startswith(mountns.READY + " "):
                raise OSError(answer.removeprefix("error ") or "the namespace holder did not answer")
        except BaseException:
            if holder is not None:
                _stop(holder)
            remove_tree(temp)
            raise
        rank = {"mode": "overlay", "holder": holder.pid, "user": answer.split()[1] == "1", "cwd": self.cwd}
        lowers = [(target, upper) for target, upper, _ in layers]
        return RunWorkdir(label, "overlay", self.cwd, {RANK_ENV: json.dumps(rank)}, temp, lowers, holder)

    def _view(self, label: str, janitor: Janitorial) -> RunWorkdir:
        if self.state is None:
            self.state = self._scan()
        temp = tempfile.mkdtemp(prefix="ddpchk-view-")
        janitor.remove(temp)
        where = os.path.join(temp, "view")
        try:
            os.mkdir(where)
            view.build(self.cwd, where, copies=True)
        except OSError as exc:
            remove_tree(temp)
            raise WorkdirUnavailable(f"cannot make a view of {self.cwd}: {exc}") from None
        except BaseException:
            remove_tree(temp)
            raise
        rank = {"mode": "view", "view": where, "real": self.cwd}
        return RunWorkdir(label, "view", where, {RANK_ENV: json.dumps(rank)}, temp)

    def _scan(self) -> dict[str, tuple[int, int, int]] | None:
        skip = [*self.own, os.path.realpath(tempfile.gettempdir())]  # ours, and other programs' temp
        return scan(self.cwd, [path for path in skip if _inside(path, self.cwd)])

    # --- the report ----------------------------------------------------------------------------------

    def notes(self) -> list[str]:
        """One note per distinct set of paths written, naming the runs that wrote it."""
        groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
        first: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Change, ...]] = {}
        for label, how, changes in self.written:
            if changes and label:
                key = (how, tuple((c.kind, c.path) for c in changes))
                groups.setdefault(key, [])
                if label not in groups[key]:
                    groups[key].append(label)
                first.setdefault(key, changes)
        leaked = any(how == "leaked" for how, _ in groups)
        notes = []
        for key, labels in groups.items():
            how, what, at = key[0], _what(first[key]), _runs(labels)
            if how == "overlay":
                notes.append(
                    f"the script {what} in its working directory at {at}; every run started from your "
                    "directory as you left it, and your directory is unchanged"
                )
            elif how == "view":
                after = "" if leaked else ", and your directory is unchanged"
                if self.state is None:  # too large to compare
                    after = f" (your directory itself, over {SCAN_LIMIT:,} entries, was not compared)"
                notes.append(
                    f"the script {what} in its working directory at {at}; every run started from a view "
                    f"of your directory ({self._view_why()}) and what it wrote stayed in the view{after}"
                )
            else:
                notes.append(
                    f"the script {what} in your directory itself at {at}, past ddpcheck's view of it (a "
                    "write not made by Python's file calls, e.g. torch.save onto an existing file): the "
                    "runs after it started from the changed directory, and it stays changed"
                )
        return notes

    def _view_why(self) -> str:
        if self.why:
            return f"no private mount namespace here: {self.why}"
        return f"{WORKDIR_ENV}=view"


# --- what a run wrote ------------------------------------------------------------------------------------


def upper_changes(upper: str, lower: str, cwd: str) -> list[Change]:
    """What an overlay's upper folder holds over ``lower``: new or changed files, new folders (one change
    each), deletions (overlayfs whiteouts). A file copied up unchanged (opened for writing, chmod) is
    no change."""
    prefix = os.path.relpath(lower, cwd)
    found: list[Change] = []

    def walk(folder: str, rel: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                path = os.path.join(rel, entry.name) if rel else entry.name
                shown = os.path.normpath(os.path.join(prefix, path))
                below = os.path.join(lower, path)
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    found.append(Change("deleted", shown))
                elif stat.S_ISDIR(info.st_mode):
                    if os.path.isdir(below) and not os.path.islink(below) and not _opaque(entry.path):
                        walk(entry.path, path)
                    else:
                        size, files = _tree_size(entry.path)
                        found.append(Change("wrote", shown + "/", size, files))
                elif _differs(below, info):
                    found.append(Change("wrote", shown, info.st_size))

    walk(upper, "")
    return found


def view_changes(where: str, real: str) -> list[Change]:
    """What a view holds over the directory it shows: entries that are no longer its links (new or
    changed), folders it materialised (walked), entries gone (deleted)."""
    found: list[Change] = []

    def walk(folder: str, rel: str) -> None:
        source = os.path.join(real, rel) if rel else real
        try:
            before = set(os.listdir(source))
        except OSError:
            before = set()
        with os.scandir(folder) as entries:
            names = sorted(entries, key=lambda e: e.name)
        for entry in names:
            path = os.path.join(rel, entry.name) if rel else entry.name
            below = os.path.join(real, path)
            before.discard(entry.name)
            if entry.is_symlink() and os.readlink(entry.path) == below:
                continue  # still the view's link: untouched
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if os.path.isdir(below) and not os.path.islink(below):
                    walk(entry.path, path)
                else:
                    size, files = _tree_size(entry.path)
                    found.append(Change("wrote", path + "/", size, files))
            elif _differs(below, info):
                found.append(Change("wrote", path, info.st_size))
        found.extend(Change("deleted", os.path.join(rel, name) if rel else name) for name in sorted(before))

    walk(where, "")
    return found


def scan(root: str, skip: Sequence[str] = ()) -> dict[str, tuple[int, int, int]] | None:
    """Every path below ``root`` (not following links, not into ``skip``) -> (mode, size, mtime_ns);
    None past :data:`SCAN_LIMIT` entries (too large to watch)."""
    found: dict[str, tuple[int, int, int]] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        folder = os.path.join(root, rel) if rel else root
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.path in skip:
                continue
            path = os.path.join(rel, entry.name) if rel else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found[path] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns)
            if len(found) > SCAN_LIMIT:
                return None
            if stat.S_ISDIR(info.st_mode):
                pending.append(path)
    return found


def compare(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> list[Change]:
    """What changed between two scans: a new or deleted folder is one change."""
    found: list[Change] = []
    new_dirs: list[str] = []
    gone_dirs: list[str] = []
    for path in sorted(after):
        if any(path.startswith(d + os.sep) for d in new_dirs):
            continue
        mode, size, mtime = after[path]
        old = before.get(path)
        if old is None and stat.S_ISDIR(mode):
            new_dirs.append(path)
            inside = [v for p, v in after.items() if p.startswith(path + os.sep) and not stat.S_ISDIR(v[0])]
            found.append(Change("wrote", path + "/", sum(v[1] for v in inside), len(inside)))
        elif old is None or (not stat.S_ISDIR(mode) and old != (mode, size, mtime)):
            found.append(Change("wrote", path, size))
    for path in sorted(before):
        if path not in after and not any(path.startswith(d + os.sep) for d in gone_dirs):
            if stat.S_ISDIR(before[path][0]):
                gone_dirs.append(path)
            found.append(Change("deleted", path))
    return found


def submounts(cwd: str) -> list[str]:
    """Filesystems mounted below ``cwd`` (parents first): each gets its own overlay, as an overlay does
    not reach into the mounts below its lower folder. A file mounted on its own cannot have one."""
    try:
        with open("/proc/self/mountinfo", "rb") as handle:
            lines = handle.read().decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if _inside(point, cwd) and point != cwd and point not in found:
            found.append(point)
    found.sort(key=lambda p: p.count("/"))
    for point in found:
        if not os.path.isdir(point):
            raise OSError(f"{os.path.relpath(point, cwd)} is a file mounted on its own")
    return found


def _unescape(field_text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field_text = field_text.replace("\\" + code, chr(int(code, 8)))
    return field_text


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _differs(below: str, info: os.stat_result) -> bool:
    try:
        old = os.lstat(below)
    except OSError:
        return True
    return (stat.S_IFMT(old.st_mode), old.st_size, old.st_mtime_ns) != (
        stat.S_IFMT(info.st_mode),
        info.st_size,
        info.st_mtime_ns,
    )


def _opaque(path: str) -> bool:
    """A folder the run deleted and made again: overlayfs marks it opaque (nothing of the lower shows)."""
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError, AttributeError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def _tree_size(folder: str) -> tuple[int, int]:
    size = files = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(parent, name)).st_size
                files += 1
    return size, files


def _what(changes: Sequence[Change]) -> str:
    """``wrote gpt_snapshot.pt (12 kB) and runs/ (3 files, 1.2 MB), deleted old.txt``."""
    named = [*(c for c in changes if c.kind == "wrote"), *(c for c in changes if c.kind == "deleted")]
    wrote = [_item(c) for c in named[:SHOWN] if c.kind == "wrote"]
    deleted = [c.path for c in named[:SHOWN] if c.kind == "deleted"]
    parts = [f"wrote {_joined(wrote)}"] if wrote else []
    parts += [f"deleted {_joined(deleted)}"] if deleted else []
    more = len(named) - SHOWN
    return ", ".join(parts) + (f" (and {count_text(more, 'more paths')})" if more > 0 else "")


def _item(change: Change) -> str:
    if not change.path.endswith("/"):
        return f"{change.path} ({size_text(change.size)})"
    if not change.files:
        return f"{change.path} (empty)"
    return (
        f"{change.path} ({change.files} {'file' if change.files == 1 else 'files'}, {size_text(change.size)})"
    )


def size_text(size: int) -> str:
    """``12 kB``, ``1.2 MB``: decimal units, as ``ls -h --si`` says them."""
    if size < 1000:
        return "1 byte" if size == 1 else f"{size} bytes"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            return f"{value:.3g} {unit}"
    return f"{size} bytes"


def _runs(labels: Sequence[str]) -> str:
    """``world sizes 1 and 2``; ``world size 1 and mesh dp=2,tp=2``."""
    prefix = "world size "
    if len(labels) > 1 and all(label.startswith(prefix) for label in labels):
        sizes = [label[len(prefix) :] for label in labels]
        return "world sizes " + _joined(sizes)
    return _joined(list(labels))


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _answer(holder: subprocess.Popen[bytes], timeout: float) -> str:
    """The holder's first line, or "" if it ended or said nothing in time (never blocks past it)."""
    assert holder.stdout is not None
    deadline = time.monotonic() + timeout
    data = b""
    fd = holder.stdout.fileno()
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\n", 1)[0].strip()


def _stop(holder: subprocess.Popen[bytes]) -> None:
    """End a holder (it has nothing to finish: SIGKILL) and reap it."""
    kill_group(holder.pid)
    reap(holder.pid, 5.0)
    for pipe in (holder.stdin, holder.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    holder.returncode = holder.returncode if holder.returncode is not None else -9


# --- the rank side -------------------------------------------------------------------------------------


def enter_workdir() -> str:
    """In a rank, before anything starts a thread: enter the run's view of the working directory that
    the launcher named (:data:`RANK_ENV`). Returns why it could not ("" when it did, or none was named)."""
    text = os.environ.pop(RANK_ENV, "")
    if not text:
        return ""
    try:
        spec = json.loads(text)
        if spec["mode"] == "overlay":
            mountns.join(int(spec["holder"]), bool(spec["user"]), str(spec["cwd"]))
        elif spec["mode"] == "view":
            view.install(str(spec["view"]), str(spec["real"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"cannot enter this run's view of the working directory: {exc}"
    return ""
