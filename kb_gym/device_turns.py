"""A device's jobs side by side, or one job with the device to itself: after a job ran out of the device's memory
beside others.

With several workers on one device (``Evaluator(workers_per_device=2)``) each job's judge and runner hold their own
memory for the whole job, outside the stages the device lock serialises: inputs, the reference's outputs, the float64
answer, the candidate's outputs. Problems sized for an H200 (outputs of 6-7 GB) fit two such jobs in its 141 GB and
not in an H100's 80 GB: there the judges' input clones, comparisons and float64 answers ran out of memory beside each
other (session 38: 6-8 of the batch's 64 candidates, reference copies among them, ``crash``). A job that ran out of the
device's memory is therefore run again with more of the device: alone once the jobs beside it have ended
(``DeviceTurns.alone``), then, if its judge runs out again while the device's other workers are alive, with them stopped
(``Evaluator._evict_others``; each starts again with its next job): idle, they still held ~37 GB of the H100 (CUDA
contexts, spares, the probe, the device buffers of ``KB_GYM_DEVICE_PAYLOAD=1``), and a retried 23_Softmax ran out
beside them. The last run is the verdict: with the device to itself, a candidate that exhausts the memory has done so
itself. A runner's out-of-memory (the candidate's footprint; buggy kernels ask for a terabyte often) is retried alone
at most, and sets nothing for its problem; where the judge's memory ran out and a retry did not, the problem's later
jobs start at that turn for TURN_MEMORY_S.

The turns are this Evaluator's: another Evaluator on the host shares the device through the host-wide device lock,
which serialises stages, not memory.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

# The turns a job can have, from least to most of the device (Evaluator._run_turns): beside the device's other jobs;
# alone, once they have ended; alone with the device's other workers stopped.
SIDE_BY_SIDE, ALONE, EVICTING = 0, 1, 2
# A problem whose judge ran out of memory side by side starts its jobs at the turn that worked for this long, then
# side by side again (one wasted attempt per problem at most this often): what its company held may be gone, and a
# turn set by chance must not cost the problem's later jobs for the Evaluator's life.
TURN_MEMORY_S = 600.0


class Turn:
    """One job's time on the device; ``overlapped``: whether another job of the device ran during any of it."""

    def __init__(self, alone: bool) -> None:
        self.alone = alone
        self.overlapped = False


class DeviceTurns:
    """Jobs on one device: any number at once (``shared``), or one alone (``alone``), which waits for the running
    jobs to end and keeps new ones waiting until it is done. A job waiting to run alone goes before jobs not yet
    started, so it cannot be starved by a stream of shared ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: list[Turn] = []
        self._waiting_alone = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[Turn]:
        turn = Turn(alone=False)
        with self._cond:
            self._cond.wait_for(lambda: not self._waiting_alone and not any(t.alone for t in self._active))
            self._enter(turn)
        try:
            yield turn
        finally:
            self._leave(turn)

    @contextlib.contextmanager
    def alone(self) -> Iterator[Turn]:
        turn = Turn(alone=True)
        with self._cond:
            self._waiting_alone += 1
            self._cond.wait_for(lambda: not self._active)
            self._waiting_alone -= 1
            self._enter(turn)
        try:
            yield turn
        finally:
            self._leave(turn)

    def turn(self, alone: bool) -> contextlib.AbstractContextManager[Turn]:
        return self.alone() if alone else self.shared()

    def _enter(self, turn: Turn) -> None:  # with the condition held
        if self._active:
            turn.overlapped = True
            for other in self._active:
                other.overlapped = True
        self._active.append(turn)

    def _leave(self, turn: Turn) -> None:
        with self._cond:
            self._active.remove(turn)
            self._cond.notify_all()
