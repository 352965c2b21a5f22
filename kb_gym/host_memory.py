"""Host memory held by a process tree: what the worker watchdog holds against ``memory_limit_mb``.

Resident size alone misses memory that no process has touched through a mapping: pages of a memfd or a
tmpfs file filled by ``write`` or ``fallocate`` are in no process's RSS, yet the machine holds them while
any descriptor or mapping keeps the file (red team round 4: 2.1 GB held under a 2 GB limit). So the tree's
memory is its anonymous and file-backed resident pages plus, counted once each however many processes
share them, the allocated size of every in-memory file (memfd, tmpfs, SysV segment, shared anonymous
mapping) that one of its processes holds open or mapped. The result is never below the plain RSS sum, so
nothing the old measure caught goes uncounted.
"""

from __future__ import annotations

import os
import stat

# How an in-memory file shows in /proc/PID/fd and /proc/PID/maps: memfds, SysV segments, shared anonymous
# mappings (an internal shmem file), and the runner's private /dev/shm.
SHMEM_PREFIXES = ("/memfd:", "/SYSV", "/dev/zero", "/dev/shm/")
_MEMORY_FS = ("tmpfs", "ramfs", "hugetlbfs")


def _status_kb(pid: int) -> dict[str, int]:
    values = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Rss"):
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0])
    return values


def memory_fs_devices(pid: int) -> set[int]:
    """Device numbers of the in-memory file systems mounted in ``pid``'s mount namespace."""
    found = set()
    try:
        with open(f"/proc/{pid}/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] in _MEMORY_FS:
                    major, minor = left.split()[2].split(":")
                    found.add(os.makedev(int(major), int(minor)))
    except OSError:
        pass
    return found


def _in_memory_files(pid: int, devices: set[int]) -> list[tuple[str, str]]:
    """(/proc path, file name) of what ``pid`` may hold an in-memory file through: its descriptors of files
    (fd/N) and its mappings of in-memory files (map_files/RANGE)."""
    paths = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/"):  # not a pipe, socket or anon inode
                paths.append((f"/proc/{pid}/fd/{fd}", target))
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                fields = line.split(None, 5)
                if len(fields) < 6 or not fields[5].startswith("/"):
                    continue
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if fields[5].startswith(SHMEM_PREFIXES) or os.makedev(major, minor) in devices:
                    paths.append((f"/proc/{pid}/map_files/{fields[0]}", fields[5].rstrip("\n")))
    except OSError:
        pass
    return paths


def tree_memory_bytes(root_pid: int, root_private: bool = True) -> int:
    """Host memory held by ``root_pid`` and its descendants (0 once the root is gone): see the module's doc.

    ``root_private=False`` leaves out the root's own resident pages but not the in-memory files it holds: the
    worker watchdog's measure of what a candidate controls. The root there is the judge, whose own memory is the
    problem's (the reference, its inputs, the outputs it copies, its pinned staging: bounded by the reference's
    shapes, not the candidate's choices); held against the candidate's limit, it charged honest copies of a
    GPU-size problem ``crash`` (H100, session 39: ``23_Softmax``'s judge at 34.8 GB against 32 GB). A file the
    runner was given and could fill (the payload memfd) counts wherever it is held."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    rss_sum = private = 0
    seen: set[tuple[int, int]] = set()
    shared = 0
    for proc in procs:  # one by one: a process that exits mid-walk must not hide the rest
        own = root_private or proc.pid != root_pid
        try:
            rss = proc.memory_info().rss
        except psutil.Error:
            continue
        rss_sum += rss if own else 0
        try:
            kb = _status_kb(proc.pid)
            private += (kb.get("RssAnon", 0) + kb.get("RssFile", 0)) * 1024 if own else 0
        except (OSError, ValueError):
            private += rss if own else 0
            continue
        devices = memory_fs_devices(proc.pid)
        try:
            born = proc.create_time() - 1.0
        except psutil.Error:
            continue
        for path, target in _in_memory_files(proc.pid, devices):
            try:
                st = os.stat(path)
            except OSError:  # closed or unmapped meanwhile, or map_files not readable here
                continue
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            # A file on a tmpfs counts when it is newer than the process: where the root file system itself
            # is a tmpfs, the libraries every worker maps are old files there and are not the candidate's.
            if target.startswith(SHMEM_PREFIXES) or (st.st_dev in devices and st.st_ctime >= born):
                seen.add((st.st_dev, st.st_ino))
                shared += st.st_blocks * 512
    return max(rss_sum, private + shared)
