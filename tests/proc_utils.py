"""Process and socket inspection through /proc, for tests that prove nothing outlives a run."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (zombies excluded)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        nxt = {child for child, parent in parents.items() if parent in frontier and child not in found}
        found |= nxt
        frontier = nxt
    return found


def processes_with_env(key: str, value: str) -> set[int]:
    """Live processes whose environment has ``key=value`` (survives re-parenting to init)."""
    needle = f"{key}={value}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


def wait_until_gone(probe, timeout: float = 10.0) -> set[int]:  # type: ignore[no-untyped-def]
    """Poll ``probe()`` until it returns an empty set or the timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    left = probe()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = probe()
    return left


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def listening_addresses(inodes: set[int]) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets in LISTEN state among ``inodes`` (IPv4 and IPv6)."""
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] != "0A" or int(parts[9]) not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = parts[1].split(":")
            raw = bytes.fromhex(hex_addr)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, struct.pack("<I", int.from_bytes(raw, "big")))
            else:
                words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
                addr = socket.inet_ntop(family, b"".join(words))
            out.append((addr, int(hex_port, 16)))
    return out
