"""Process plumbing every wait in the launch layer relies on: framed pipes, exit watches, reaping.

The parent never blocks on anything a child controls. A result pipe is read without blocking and
reassembled here (a child stopped half-way through its message costs a deadline, not a hang); a
child's exit is watched through its own pid (a pidfd), not through a pipe that a helper process the
user started could hold open; output is read from the end of its file, never whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("!Q")
_CHUNK = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def write_frame(fd: int, obj: Any) -> int:
    """Send one message: an 8-byte length, then the plain pickle (blocking is fine on the child side).
    Returns the pickle's size."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    for part in (_HEADER.pack(len(data)), data):  # no header + data copy: results can be 100s of MB
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]
    return len(data)


def read_frame(fd: int) -> Any:
    """Wait for one :func:`write_frame` message on a blocking pipe (a child reading its orders; the
    parent never waits like this). EOFError when the writer has gone."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), _CHUNK))
        if not chunk:
            raise EOFError("the other end of the pipe closed")
        data += chunk
    return bytes(data)


class FrameReader:
    """Non-blocking reassembly of :func:`write_frame` messages from one pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False
        os.set_blocking(fd, False)

    def fileno(self) -> int:
        return self.fd

    def pump(self) -> list[Any]:
        """Read what is there now (never waits); return the messages completed by it."""
        while not self.eof:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                break
            except OSError:
                self.eof = True
                break
            if not chunk:
                self.eof = True
            self.buffer += chunk
        messages = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            with memoryview(self.buffer) as whole:  # unpickle in place, without a copy of the frame
                raw = whole[_HEADER.size : _HEADER.size + size]
                try:
                    messages.append(pickle.loads(raw))
                except Exception as exc:  # a value that does not unpickle here
                    messages.append(("unreadable", f"result could not be read: {exc}"))
                finally:
                    raw.release()
            del self.buffer[: _HEADER.size + size]
        return messages

    @property
    def partial(self) -> int:
        """Bytes of a message that started but never completed."""
        return len(self.buffer)


class ExitWatch:
    """Readable when process ``pid`` has exited, whoever else holds its pipes (pidfd; polled otherwise)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def wait_objects(watch: ExitWatch) -> list[Any]:
    return [watch.fd] if watch.fd is not None else []


def poll_interval(watches: list[ExitWatch]) -> float | None:
    """Without pidfds, exits are noticed by polling at this interval."""
    return 0.05 if any(w.fd is None for w in watches) else None


def read_tail(path: str, limit: int) -> str:
    """The last ``limit`` bytes of a file, with a note of how much came before; never reads the rest."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(size - limit, 0)
            handle.seek(start)
            data = handle.read(limit)
    except OSError:
        return ""
    return _with_cut(data, start)


def read_span_tail(path: str, begin: int, end: int, limit: int) -> str:
    """The last ``limit`` bytes of ``path[begin:end]`` (one simulated rank's share of a shared file)."""
    start = max(begin, end - limit)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(max(end - start, 0))
    except OSError:
        return ""
    return _with_cut(data, start - begin)


def _with_cut(data: bytes, cut: int) -> str:
    text = data.decode("utf-8", "replace")
    if cut:
        return f"[... {cut} earlier bytes of output cut; the last {len(data)} follow ...]\n{text}"
    return text


SOCKET_PATH_MAX = 107  # bytes of an AF_UNIX socket path (sun_path less its NUL)
SOCKET_ROOM = 36  # kept free below a rank's temp dir: multiprocessing's "/pymp-XXXXXXXX/listener-XXXXXXXX"
FALLBACK_TMP = "/tmp"


def short_tempdir(prefix: str) -> str:
    """``mkdtemp`` for a directory ranks use as their TMPDIR, short enough for sockets below it.

    DataLoader workers pass descriptors, and ``multiprocessing.Manager`` listens, on AF_UNIX sockets
    under the temp dir; a path over 107 bytes hangs the workers or fails the Manager. CI runners' temp
    dirs are long (~55 characters): under one the directory goes to ``/tmp`` instead."""
    base = tempfile.gettempdir()
    if len(os.path.join(base, prefix)) + 8 + SOCKET_ROOM > SOCKET_PATH_MAX and os.access(
        FALLBACK_TMP, os.W_OK
    ):
        base = FALLBACK_TMP
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def process_state(pid: int) -> str:
    """One-letter state from /proc (R, S, T for stopped, Z, ...), or '' when unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _prctl(option: int, value: int = 0) -> int:
    if sys.platform != "linux":
        return -1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if option == _PR_GET_CHILD_SUBREAPER:
            out = ctypes.c_int(0)
            if libc.prctl(option, ctypes.byref(out), 0, 0, 0) != 0:
                return -1
            return out.value
        return int(libc.prctl(option, value, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


class Reaper:
    """While active, orphans of this process's descendants are re-parented here (a child subreaper).

    A user process that escaped its rank's process group (``setsid``, a double fork) then stays
    findable: :meth:`sweep` kills and reaps every child that was not ours before, and its process
    group. Nothing is reaped that existed before :meth:`start`.
    """

    def __init__(self) -> None:
        self.before: set[int] = set()
        self.previous = -1

    def start(self) -> None:
        self.before = own_children()
        self.previous = _prctl(_PR_GET_CHILD_SUBREAPER)
        if self.previous == 0:
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)

    def sweep(self, known: set[int]) -> list[int]:
        """Kill and reap the orphans that arrived since :meth:`start` (not ``known``); returns their pids."""
        found: list[int] = []
        for _ in range(3):  # a killed orphan's own children arrive here in turn
            extra = {
                pid
                for pid in own_children() - self.before - known - set(found)
                if not _in_our_group(pid)  # ours, not an orphan: e.g. multiprocessing's resource tracker
            }
            if not extra:
                break
            for pid in extra:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            for pid in extra:
                reap(pid, 2.0)
            found += sorted(extra)
        return found

    def stop(self) -> None:
        if self.previous == 0:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)


def _in_our_group(pid: int) -> bool:
    """Rank descendants live in the ranks' own process groups (or sessions), never in ours."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


def own_children() -> set[int]:
    """Pids whose parent is this process (zombies included: they still need reaping)."""
    me = os.getpid()
    children: set[int] = set()
    try:
        for task in Path(f"/proc/{me}/task").iterdir():
            children.update(int(p) for p in (task / "children").read_text().split())
        return children
    except OSError:  # no /proc/*/children in this kernel: scan every process's parent
        pass
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    children.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return children


def reap(pid: int, timeout: float) -> bool:
    """waitpid with a deadline (never blocks past it); whether ``pid`` is gone.

    Waits on the process's pidfd, so it returns the moment the process exits (a group's janitor is
    reaped on the critical path between groups); without pidfds it polls every 2 ms."""
    deadline = time.monotonic() + timeout
    watch: ExitWatch | None = None
    try:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if done:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if watch is None:
                watch = ExitWatch(pid)
            if watch.fd is None:
                time.sleep(min(0.002, left))
            else:
                select.select([watch.fd], [], [], left)
    finally:
        if watch is not None:
            watch.close()


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and the process itself (stopped ones die too)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


# The janitor as a shell script: spawned without copying this process (which holds torch: a fork costs
# ~10 ms and its exit as much again, once per group), it reads pids until "done" or end-of-file.
# POSIX sh only (dash's kill takes no "--"): "kill -9 -PID" is the process group PID.
_JANITOR_SCRIPT = """
set -f
nl='
'
pids=
dirs=$1
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    /*) dirs="$dirs$nl$line" ;;
    ''|*[!0-9]*) ;;
    *) pids="$pids $line" ;;
  esac
done
for pid in $pids; do kill -9 "-$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; done
IFS=$nl
for dir in $dirs; do chmod -R u+rwx -- "$dir" 2>/dev/null; rm -rf -- "$dir"; done
"""


class Janitor:
    """A tiny process that cleans up after this one if it dies without doing so (SIGKILL).

    It waits for end-of-file on a pipe only this process holds (ranks close their copy first thing);
    unless told ``done`` it then kills the process groups it was told about and removes ``workdir`` and
    the folders it was told about.
    It runs in its own session, so a Ctrl-C in the terminal is not for it.
    """

    def __init__(self, workdir: str) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self.pid = _spawn_janitor(read_fd, workdir)
        except (AttributeError, NotImplementedError, OSError):  # no posix_spawn with setsid, or no /bin/sh
            self.pid = os.fork()
            if self.pid == 0:  # pragma: no cover - runs in the janitor
                _janitor_main(read_fd, write_fd, workdir)
        os.close(read_fd)
        self.fd = write_fd

    def watch(self, pid: int) -> None:
        """Kill ``pid``'s process group too if this process dies."""
        if self.fd >= 0:
            os.write(self.fd, f"{pid}\n".encode())

    def remove(self, path: str) -> None:
        """Remove the folder ``path`` (absolute, one line) too if this process dies."""
        if self.fd >= 0 and os.path.isabs(path) and "\n" not in path:
            os.write(self.fd, f"{path}\n".encode())

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.write(self.fd, b"done\n")
            except OSError:  # it is gone already (killed from outside): nothing to tell it
                pass
            finally:
                os.close(self.fd)
                self.fd = -1
            if not reap(self.pid, 2.0):  # a stalled machine can hold even a shell back: it has no work left
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
                reap(self.pid, 5.0)


def remove_tree(path: str) -> None:
    """``rm -rf``, also through folders without permissions (overlayfs leaves its work folder mode 000)."""

    def unlock(_func: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed) or ".", 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=unlock)
    else:
        shutil.rmtree(path, onerror=unlock)


def _spawn_janitor(read_fd: int, workdir: str) -> int:
    if sys.platform != "linux" or not os.path.exists("/bin/sh"):
        raise NotImplementedError
    return os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", _JANITOR_SCRIPT, "ddpcheck-janitor", workdir],
        {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
        file_actions=[
            (os.POSIX_SPAWN_DUP2, read_fd, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        ],
        setsid=True,
    )


def _janitor_main(read_fd: int, write_fd: int, workdir: str) -> None:
    try:
        os.setsid()  # a Ctrl-C in the terminal is not for it
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):  # nobody waits on a pipe this process still holds
            os.dup2(null, std)
        os.closerange(3, read_fd)
        os.closerange(read_fd + 1, 1 << 16)
        data = b""
        while True:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
        lines = data.decode(errors="replace").splitlines()
        if "done" not in lines:
            for line in lines:
                if line.isdigit():
                    kill_group(int(line))
            for folder in [workdir, *(line for line in lines if line.startswith("/"))]:
                remove_tree(folder)
    finally:
        os._exit(0)
