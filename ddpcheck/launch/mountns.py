"""A private mount namespace per run in which the working directory is an overlay (Linux).

``python -I -S mountns.py SPEC`` (this file, run by its path) is the *holder* of one run: it leaves the
host's mount namespace (as root, or in a user namespace of its own that maps the user to itself), mounts
an overlayfs ON the working directory (the user's directory is its lower layer, a temp directory its
upper), one per filesystem mounted below it, binds ddpcheck's own folders back where they lie below it,
says ``ok`` and waits until it is killed. Every rank of the run enters that namespace (:func:`join`),
so all ranks see one directory (a checkpoint one rank writes, another may read, as on a shared
filesystem), every write lands in the upper directory, and the user's directory is never written.
Overlayfs refuses two mounts sharing an upper directory, hence one holder per run, not one per rank.

Only the standard library: the holder runs without ddpcheck's package, and a rank imports this before
anything starts a thread (``setns`` into a mount namespace fails in a multi-threaded process).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Sequence

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
READY = "ok"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _unshare(flags: int) -> None:
    _call(_libc().unshare(flags), "unshare")


def _setns(fd: int, kind: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, kind)
        return
    _call(_libc().setns(fd, kind), "setns")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    result = libc.mount(
        source.encode() if source else None,
        os.fsencode(target),
        fstype.encode() if fstype else None,
        flags,
        os.fsencode(data) if data else None,
    )
    _call(result, f"mount {fstype or 'bind'} on {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _own_namespace() -> bool:
    """Leave the host's mount namespace; True when that took a user namespace of our own."""
    if os.geteuid() == 0:
        try:
            _unshare(CLONE_NEWNS)
            return False
        except OSError:  # root without CAP_SYS_ADMIN (a container): try a user namespace
            pass
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | CLONE_NEWNS)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")  # the user stays who they are inside
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return True


def hold(spec: dict[str, object]) -> bool:
    """Set up the run's namespace in this process (see the module docstring); returns whether it is in
    a user namespace of its own. ``spec``: ``layers`` [[target, upper, work], ...] parents first,
    ``keep`` [paths below a target that stay the host's]."""
    user = _own_namespace()
    _mount("", "/", None, MS_REC | MS_PRIVATE, None)  # nothing we mount reaches the host
    layers = [tuple(map(str, layer)) for layer in spec["layers"]]  # type: ignore[attr-defined]
    keep = [str(path) for path in spec.get("keep", [])]  # type: ignore[attr-defined]
    # every lower layer and kept folder is opened before anything is mounted over it
    lowers = [os.open(target, os.O_PATH | os.O_DIRECTORY) for target, _, _ in layers]
    kept = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep]
    for (target, upper, work), fd in zip(layers, lowers, strict=True):
        options = f"lowerdir=/proc/self/fd/{fd},upperdir={_escaped(upper)},workdir={_escaped(work)}"
        _mount("overlay", target, "overlay", 0, options)
    for path, fd in zip(keep, kept, strict=True):
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
    for fd in (*lowers, *kept):
        os.close(fd)
    return user


def _escaped(path: str) -> str:
    """Overlayfs options are split at commas (and ``\\`` escapes): such paths are escaped."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def join(holder: int, user: bool, cwd: str) -> None:
    """Enter the run's namespace held by ``holder`` (its user namespace first) and the working
    directory again, now the overlay. Call it while the process has one thread."""
    fds = []
    try:
        if user:
            fds.append((os.open(f"/proc/{holder}/ns/user", os.O_RDONLY), CLONE_NEWUSER))
        fds.append((os.open(f"/proc/{holder}/ns/mnt", os.O_RDONLY), CLONE_NEWNS))
        for fd, kind in fds:
            _setns(fd, kind)
    finally:
        for fd, _ in fds:
            os.close(fd)
    os.chdir(cwd)


def main(argv: Sequence[str]) -> int:
    """The holder: ``ok USER`` on stdout once the namespace is ready (``error MESSAGE`` if it cannot
    be), then it waits until it is killed (or its stdin ends), and dies with its parent."""
    try:
        _libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when ddpcheck goes
        user = hold(json.loads(argv[0]))
    except Exception as exc:  # any reason at all: the caller falls back and says why
        print(f"error {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", flush=True)
        return 1
    print(f"{READY} {int(user)}", flush=True)
    sys.stdin.buffer.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
