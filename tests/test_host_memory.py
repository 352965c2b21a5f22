"""The watchdog's measure of a worker tree's host memory (kb_gym/host_memory.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from kb_gym.host_memory import candidate_memory_bytes, tree_memory_bytes

MB = 1 << 20

# A parent and its child share one memfd (the child inherits it): 300 MB allocated, touched by nobody.
HOLDER = """
import mmap, os, sys, time
fd = os.memfd_create("held")
os.posix_fallocate(fd, 0, 300 << 20)
if os.fork() == 0:
    mmap.mmap(fd, 300 << 20)  # the child maps it too: still one file, counted once
    time.sleep(60)
print("ready", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def _tree(program: str) -> Iterator[subprocess.Popen]:
    """``program`` run with its output piped, then killed with every process it forked."""
    proc = subprocess.Popen([sys.executable, "-P", "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
def test_memfd_pages_count_once_for_the_tree_and_never_below_resident_size():
    with _tree(HOLDER) as proc:
        assert proc.stdout.readline().strip() == "ready"
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        rss = sum(p.memory_info().rss for p in tree)
        held = tree_memory_bytes(proc.pid)
        assert held >= rss
        assert 300 * MB <= held - rss + 64 * MB  # the memfd's pages, in no RSS
        assert held < rss + 2 * 300 * MB  # once, though two processes hold it


def test_a_tree_that_is_gone_holds_nothing():
    proc = subprocess.Popen([sys.executable, "-P", "-c", "pass"])
    proc.wait()
    assert tree_memory_bytes(proc.pid) == 0


# A judge with 400 MB of its own pages, a spare holding its 300 MB memfd (the judge keeps the descriptor too), and a
# runner given a 200 MB memfd it filled, then closed and unmapped: only the judge holds that one now.
JUDGE = """
import mmap, os, sys, time
spare_fd = os.memfd_create("spare")
os.posix_fallocate(spare_fd, 0, 300 << 20)
spare = os.fork()
if spare == 0:
    mmap.mmap(spare_fd, 300 << 20)
    time.sleep(60)
runner_fd = os.memfd_create("payload")
runner = os.fork()
if runner == 0:
    os.close(spare_fd)  # the spare's is not its (a zygote forks each runner with its own only)
    os.posix_fallocate(runner_fd, 0, 200 << 20)
    os.close(runner_fd)
    print("filled", flush=True)
    time.sleep(60)
own = bytearray(400 << 20)  # after the forks: no child shares it
for i in range(0, len(own), 4096):
    own[i] = 1
time.sleep(1)
print("ready", spare, runner, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
def test_the_candidates_memory_is_its_runners_and_what_only_the_judge_holds_for_it():
    with _tree(JUDGE) as proc:
        assert proc.stdout.readline().strip() == "filled"
        ready, spare, runner = proc.stdout.readline().split()
        assert ready == "ready"
        whole = tree_memory_bytes(proc.pid)
        theirs = candidate_memory_bytes(proc.pid, proc.pid, int(runner))
        assert whole >= theirs + 400 * MB + 300 * MB  # the judge's pages and the spare's memfd are not the runner's
        assert 200 * MB <= theirs < 200 * MB + 150 * MB  # the memfd it filled, and its own few pages
        # before the judge names a runner, what the judge alone holds still counts
        assert 200 * MB <= candidate_memory_bytes(proc.pid, proc.pid, None) < 200 * MB + 16 * MB
        assert candidate_memory_bytes(proc.pid, proc.pid, int(spare)) >= 500 * MB  # a runner's memfd counts where it is held
        # a judge or runner not in the tree: the measure errs towards the limit
        assert abs(candidate_memory_bytes(proc.pid, 1 << 30, int(runner)) - tree_memory_bytes(proc.pid)) < 16 * MB
        assert candidate_memory_bytes(proc.pid, proc.pid, 1 << 30) >= whole - 400 * MB - 64 * MB
