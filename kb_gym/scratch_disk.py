"""Disk held by a worker tree: what the worker watchdog holds against ``scratch_limit_mb``.

A runner may write only beneath its scratch folder (Landlock), and no file there may exceed 1 GB
(``RLIMIT_FSIZE``), but nothing else bounds how many files it writes while its stages run: at disk speed a
candidate could fill the host's disk within its time limits, and with it the build cache and the results
store of every evaluation that comes after (red team round 6). So the watchdog measures, beside memory:

- the allocated size of everything under the worker's scratch folder (the judge's and every runner's);
- files the tree removed but still holds open or mapped: their blocks stay taken until the last holder
  lets go, and no walk of the folder sees them.

Files on in-memory file systems (memfds, tmpfs, SysV segments) are memory, counted by host_memory.py. A
folder of more than ``max_entries`` entries is reported as soon as the walk passes it: walking millions of
empty files would slow the watchdog itself, and inodes run out too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from kb_gym.host_memory import SHMEM_PREFIXES, memory_fs_devices

MAX_ENTRIES = 100_000


@dataclass
class DiskUsage:
    nbytes: int  # allocated bytes: the folder's files plus removed files still held
    entries: int  # files and folders counted under the scratch folder (the walk stops past max_entries)
    held_removed: int  # of nbytes, the removed files still held open or mapped
    max_entries: int

    @property
    def too_many_entries(self) -> bool:
        return self.entries > self.max_entries


def _walk(root: str, seen: set[tuple[int, int]], max_entries: int) -> tuple[int, int]:
    """Allocated bytes and entries under ``root``, symbolic links not followed, each inode once."""
    total = entries = 0
    stack = [root]
    while stack and entries <= max_entries:
        try:
            it = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or not readable
            continue
        with it:
            for entry in it:
                entries += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total, entries


def _held_removed(pids: list[int], seen: set[tuple[int, int]]) -> int:
    """Allocated bytes of removed regular files on disk that one of ``pids`` holds open or mapped."""
    total = 0
    for pid in pids:
        memory = memory_fs_devices(pid)
        paths = []
        try:
            paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/maps") as fh:
                paths += [f"/proc/{pid}/map_files/{line.split(None, 1)[0]}" for line in fh
                          if line.rstrip("\n").endswith(" (deleted)")]
        except OSError:
            pass
        for path in paths:
            try:
                if os.readlink(path).startswith(SHMEM_PREFIXES):  # memfds and the like: memory, not disk
                    continue
                st = os.stat(path)  # the file itself, removed or not
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink or st.st_dev in memory:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def tree_disk_usage(root_pid: int, scratch: str, max_entries: int | None = None) -> DiskUsage:
    """Disk held by ``root_pid``'s tree: everything under ``scratch`` and the removed files it still holds."""
    import psutil

    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    seen: set[tuple[int, int]] = set()
    nbytes, entries = _walk(scratch, seen, max_entries)
    try:
        root = psutil.Process(root_pid)
        pids = [root.pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        pids = []
    held = _held_removed(pids, seen)
    return DiskUsage(nbytes + held, entries, held, max_entries)
