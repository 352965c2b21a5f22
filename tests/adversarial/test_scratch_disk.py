"""Disk a candidate fills beneath its scratch folder (red team round 6, open until now).

Landlock keeps a runner's writes beneath its scratch folder and ``RLIMIT_FSIZE`` each file under 1 GB, but
nothing bounded how many files it wrote: within its stage limits, at disk speed, it could fill the host's
disk and with it the build cache and the results store of every evaluation after it. The worker watchdog now
holds the tree's disk use (the scratch folder, and removed files it still holds open) against
``disk_limit_mb``, and the folder goes with the worker. Each test asserts the verdict and that the next
honest evaluation is judged as on a fresh Evaluator.
"""

from __future__ import annotations

import os

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, cand, honest_after

from kb_gym import Evaluator, scratch_disk
from kb_gym.scratch_disk import tree_disk_usage

LIMITED = CHECK.replace(disk_limit_mb=300)


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# Three files of 200 MB, each under the 1 GB file limit, allocated at once (fallocate: the blocks are taken
# without writing them), then several of the watchdog's disk polls (one a second).
MANY_FILES_OF_SIZE = cand('''
import os, time
for _k in range(3):
    _fd = os.open(f"fill{_k}", os.O_CREAT | os.O_WRONLY, 0o600)
    os.posix_fallocate(_fd, 0, 200 << 20)
    os.close(_fd)
time.sleep(3.0)
''')

# The same blocks in files removed at once but kept open: no walk of the folder sees them.
REMOVED_BUT_HELD = cand('''
import os, time
_held = []
for _k in range(3):
    _fd = os.open(f"hidden{_k}", os.O_CREAT | os.O_RDWR, 0o600)
    os.posix_fallocate(_fd, 0, 200 << 20)
    os.unlink(f"hidden{_k}")
    _held.append(_fd)
time.sleep(3.0)
''')

# Inodes rather than bytes: a folder of empty files (the limit is lowered for the test below).
MANY_EMPTY_FILES = cand('''
import os, time
os.makedirs("many", exist_ok=True)
for _k in range(3000):
    open(f"many/{_k}", "w").close()
time.sleep(3.0)
''')


def test_the_control_fits_under_the_limit(ev):
    """The same candidate with one file of 200 MB is judged as usual (else the tests below prove nothing)."""
    one = MANY_FILES_OF_SIZE.replace("range(3)", "range(1)")
    r = ev.evaluate(GELU, one, config=LIMITED)
    assert r.status == "correct", (r.status, r.error)


@pytest.mark.parametrize("attack", [MANY_FILES_OF_SIZE, REMOVED_BUT_HELD], ids=["files", "removed_but_held"])
def test_disk_filled_beneath_the_scratch_folder_is_stopped_at_the_limit(ev, attack):
    r = ev.evaluate(GELU, attack, config=LIMITED)
    assert r.status == "crash" and "disk use" in (r.error or "") and "300 MB limit" in r.error, (r.status, r.error)
    if attack is REMOVED_BUT_HELD:
        assert "removed files still held open" in r.error, r.error
    honest_after(ev)


def test_a_folder_of_too_many_files_is_stopped(ev, monkeypatch):
    monkeypatch.setattr(scratch_disk, "MAX_ENTRIES", 2000)
    r = ev.evaluate(GELU, MANY_EMPTY_FILES, config=LIMITED)
    assert r.status == "crash" and "more than 2,000 files" in (r.error or ""), (r.status, r.error)
    monkeypatch.undo()
    honest_after(ev)


def test_the_measure_counts_each_file_once_and_removed_files_still_held(tmp_path):
    """The measure itself, on a folder of this process: hard links count once, symbolic links are not
    followed out of the folder, a removed file counts while it is held, and memfds are memory, not disk."""
    outside = tmp_path / "outside"
    outside.mkdir()
    with open(outside / "big", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 8 << 20)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with open(scratch / "a", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 4 << 20)
    os.link(scratch / "a", scratch / "a_again")
    os.symlink(outside, scratch / "link")
    base = tree_disk_usage(os.getpid(), str(scratch))
    assert 4 << 20 <= base.nbytes < 5 << 20 and base.held_removed == 0, base
    held = os.open(scratch / "gone", os.O_CREAT | os.O_RDWR, 0o600)
    memfd = os.memfd_create("not_disk")
    try:
        os.posix_fallocate(held, 0, 2 << 20)
        os.ftruncate(memfd, 16 << 20)
        os.write(memfd, b"x" * (1 << 20))
        os.unlink(scratch / "gone")
        usage = tree_disk_usage(os.getpid(), str(scratch))
        assert usage.held_removed == 2 << 20 and usage.nbytes == base.nbytes + (2 << 20), usage
    finally:
        os.close(held)
        os.close(memfd)
    assert tree_disk_usage(os.getpid(), str(scratch)).nbytes == base.nbytes
