"""The watchdog's measure of a worker tree's host memory (kb_gym/host_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from kb_gym.host_memory import tree_memory_bytes

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


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
def test_memfd_pages_count_once_for_the_tree_and_never_below_resident_size():
    proc = subprocess.Popen([sys.executable, "-P", "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        rss = sum(p.memory_info().rss for p in tree)
        held = tree_memory_bytes(proc.pid)
        assert held >= rss
        assert 300 * MB <= held - rss + 64 * MB  # the memfd's pages, in no RSS
        assert held < rss + 2 * 300 * MB  # once, though two processes hold it
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()


def test_a_tree_that_is_gone_holds_nothing():
    proc = subprocess.Popen([sys.executable, "-P", "-c", "pass"])
    proc.wait()
    assert tree_memory_bytes(proc.pid) == 0


# The root (a judge) holds 400 MB of its own touched memory and a 200 MB memfd its child (a runner) was given and
# closed again: the candidate's measure leaves out the first, never the second.
JUDGE = """
import mmap, os, sys, time
fd = os.memfd_create("payload")
os.posix_fallocate(fd, 0, 200 << 20)
if os.fork() == 0:
    os.close(fd)
    time.sleep(60)
own = bytearray(400 << 20)  # after the fork: the child shares none of it
for i in range(0, len(own), 4096):
    own[i] = 1
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
def test_the_judges_own_pages_are_not_the_candidates_but_a_file_it_holds_is():
    proc = subprocess.Popen([sys.executable, "-P", "-c", JUDGE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        whole, candidate = tree_memory_bytes(proc.pid), tree_memory_bytes(proc.pid, root_private=False)
        assert whole - candidate >= 400 * MB  # the judge's own pages
        assert 200 * MB <= candidate < 200 * MB + 150 * MB  # the memfd, and the child's few pages
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()
