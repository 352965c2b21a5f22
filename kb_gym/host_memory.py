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
from collections.abc import Iterable

# How an in-memory file shows in /proc/PID/fd and /proc/PID/maps: memfds, SysV segments, shared anonymous
# mappings (an internal shmem file), and the runner's private /dev/shm.
SHMEM_PREFIXES = ("/memfd:", "/SYSV", "/dev/zero", "/dev/shm/")
_MEMORY_FS = ("tmpfs", "ramfs", "hugetlbfs")


def _status(pid: int) -> tuple[int, list[int]]:
    """From one read of /proc/PID/status: the anonymous and file-backed resident bytes, and the process's numbers in
    each PID namespace it is in, the host's first (NSpid; [pid] where none is shown)."""
    resident, ids = 0, [pid]
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon:", "RssFile:")):
                resident += int(line.split()[1]) * 1024
            elif line.startswith("NSpid:"):
                ids = [int(x) for x in line.split()[1:]] or [pid]
    return resident, ids


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


def tree_memory_bytes(root_pid: int) -> int:
    """Host memory held by ``root_pid`` and its descendants (0 once the root is gone): see the module's doc."""
    _, pages, files = _walk(root_pid)
    return _held(pages, set(pages), files.values())


def _held(pages: dict[int, tuple[int, int]], pids: set[int], files: Iterable[tuple[int, set[int]]]) -> int:
    """The pages of ``pids`` and the sizes of ``files``: never below the plain RSS sum."""
    rss_sum = sum(pages[p][0] for p in pids)
    private = sum(pages[p][1] for p in pids)
    return max(rss_sum, private + sum(size for size, _ in files))


def candidate_memory_bytes(root_pid: int, judge_pid: int | None, runner_pid: int | None) -> int:
    """The host memory held against a candidate's limit in a worker's tree (rooted at ``root_pid``: the judge, or the
    sandbox wrapper whose child it is): the pages of every process but the judge, and every in-memory file the tree
    holds but those the judge shares with processes other than the job's runner and its descendants (the spares'
    memfds, premapped for the problem's outputs before any candidate ran). A payload memfd the runner filled, then
    closed and unmapped, is held by the judge alone and counts. ``judge_pid`` and ``runner_pid`` are as the judge
    knows them, numbers of its PID namespace (the runner is named before it loads the candidate). The measure errs
    towards the limit: where the judge is not found the whole tree counts, and where a named runner is not, every
    file does.

    Left out, then, are the judge's own pages, which are the problem's (the reference, its inputs, the outputs it
    copies, its pinned staging: bounded by the reference's shapes, not the candidate's choices), and the spares'
    premapped memfds (6.4 GB each on a GPU-size problem). Held against the candidate's limit, they charged honest
    copies of ``23_Softmax`` ``crash`` (H100, session 39: 34 GB against 32 GB with two spares)."""
    procs, pages, files = _walk(root_pid)
    judge = _judge(procs, root_pid, judge_pid)
    if judge is None:
        return _held(pages, set(pages), files.values())
    others = set(pages) - {judge}
    if runner_pid is None:
        theirs: set[int] = set()
    else:
        level = len(procs[judge][1]) - 1  # the judge's namespace among each process's NSpid numbers
        runner = next((host for host, (_, ids) in procs.items() if len(ids) > level and ids[level] == runner_pid),
                      None)
        if runner is None:
            return _held(pages, others, files.values())
        theirs = {runner, *(p for p in procs if _descends(procs, p, runner))}
    return _held(pages, others, [(size, holders) for size, holders in files.values()
                                 if holders & theirs or judge not in holders or holders == {judge}])


def _judge(procs: dict[int, tuple[int, list[int]]], root_pid: int, judge_pid: int | None) -> int | None:
    """The host's number of the judge: the root, or the root's child, that is ``judge_pid`` in its own innermost PID
    namespace (never a deeper process: a runner's namespace has a pid 1 of its own too)."""
    if judge_pid is None:
        return None
    return next((host for host, (parent, ids) in procs.items()
                 if (host == root_pid or parent == root_pid) and ids[-1] == judge_pid), None)


def _descends(procs: dict[int, tuple[int, list[int]]], pid: int, ancestor: int) -> bool:
    seen = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        pid = procs[pid][0]
        if pid == ancestor:
            return True
    return False


Files = dict[tuple[int, int], tuple[int, set[int]]]


def _walk(root_pid: int) -> tuple[dict[int, tuple[int, list[int]]], dict[int, tuple[int, int]], Files]:
    """The tree under ``root_pid``: {pid: (parent pid, NSpid)}; {pid: (RSS, anonymous + file-backed resident bytes)};
    and {(device, inode): (allocated bytes, pids holding it)} of the in-memory files its processes hold."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}, {}, {}
    parents: dict[int, tuple[int, list[int]]] = {}
    pages: dict[int, tuple[int, int]] = {}
    files: Files = {}
    for proc in procs:  # one by one: a process that exits mid-walk must not hide the rest
        try:
            parent, rss = proc.ppid(), proc.memory_info().rss
        except psutil.Error:
            continue
        try:
            resident, ids = _status(proc.pid)
        except (OSError, ValueError):
            parents[proc.pid], pages[proc.pid] = (parent, [proc.pid]), (rss, rss)
            continue
        parents[proc.pid], pages[proc.pid] = (parent, ids), (rss, resident)
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
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in files:
                files[key][1].add(proc.pid)
            # A file on a tmpfs counts when it is newer than the process: where the root file system itself
            # is a tmpfs, the libraries every worker maps are old files there and are not the candidate's.
            elif target.startswith(SHMEM_PREFIXES) or (st.st_dev in devices and st.st_ctime >= born):
                files[key] = (st.st_blocks * 512, {proc.pid})
    return parents, pages, files
