"""Where the answer comes from: one untimed forward traced op by op, the candidate's kernels running.

The knockout (launches.py) tests that the answer *depends on* the candidate's kernels; a kernel that only moves
PyTorch's answer passes it (round 13: PyTorch computes the whole answer and a Triton kernel copies it into an
``empty_like`` buffer, moves one element of it into a NaN-filled output, or writes the 1.0 it is multiplied by).
This trace asks instead whether PyTorch computed the answer. Every aten op runs under a ``TorchDispatchMode`` and
every launch of the candidate's own kernels (a Triton JIT function, an extension's function) through
``DataflowTrace.launch``. A tensor is the candidate's ("tainted", by storage) once a launch wrote it, and an op's
outputs are tainted where one of its inputs is. What a launch writes does *not* taint where it adds nothing:

- a copy: the written tensor's whole value is exactly that of a tensor PyTorch holds untainted (a live one, a view
  included, or one of the launch's unchanged arguments), or matches one PyTorch computed earlier at ``SAMPLES``
  random positions within the tolerance. A copy of input data returned as it is, though, is the
  kernel's work: that is what a data-movement problem (a transpose, a crop) asks for;
- a constant of the inputs: the same launch (the kernel and its occurrence in the forward) wrote the same values
  on the other input set (the trace runs twice, on two seeds: ``previous`` holds the first run's writes).

Nor does an op's result where it undoes a kernel's work: a result over a tainted input whose whole value is exactly
that of a live tensor PyTorch holds untainted (round 14: a kernel writes ``2 x`` and PyTorch halves it, or writes the
input reversed and PyTorch flips it back; round 15: ``torch.where`` with a kernel's output only as the mask).

An output is PyTorch's where it is untainted at the end, or where its values match, at ``SAMPLES`` random positions
and within the tolerance, an untainted tensor some PyTorch op computed (the answer existed before any kernel
touched it: a kernel that adds negligible values to it, or moves it, changes nothing). Every output PyTorch's:
``token_kernel``. Partial fusion is left alone: an answer written by a kernel, or by a PyTorch op over a kernel's
output, is the kernel's, unless PyTorch had computed it whole anyway.

Like the knockout, this runs in the candidate's process and is its report: defence in depth. What it does not catch
(docs/integrity.md, Open; rounds 14 and 15): a kernel's real work that PyTorch undoes along a path through no value
PyTorch holds exactly (``(2 x * 0.25) * 4``, an undo that rounds a few bits off, the elementwise work done before
the flip back), moves across shapes (PyTorch computes the answer's halves or a padded answer, the kernel
concatenates or crops), work PyTorch does in place in a storage a kernel wrote part of (taint is per storage), a
kernel that computes a sliver of the answer (the knockout's sliver rule holds it under 0.2%), compute outside the
dispatcher (numpy), writes through pointers to tensors the launch was not given, and a candidate that tells the
traced call (an active dispatch mode) and behaves there. And two honest cases it calls tokens: a kernel whose whole
work is within the tolerance of PyTorch's result (a BatchNorm with fresh running statistics as the only kernel), and
a kernel's result finished on the host through ``.item()`` or ``.tolist()`` (taint does not follow a Python number).
Session 27 tried counting a tensor made from Python numbers as the kernels' where the forward took numbers to the
host only from their tensors; round 18 got PyTorch's answer through it 17 ways of 24 (unwatched host reads, PyTorch's
value carried in a kernel's tensor, host-made constants), and it was taken out: the principled route is following
the numbers' values, not counting them.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kb_gym.worker.tensors import digest_of

Fingerprint = tuple[int, str, int]  # numel, dtype, digest of the bytes
# In-place ops that overwrite their first argument without reading its values
OVERWRITES = frozenset({"copy_", "fill_", "zero_"})
# Ops that read a tensor's shape, never its values: their results are fills, not computed from the inputs (round 15:
# ``empty_like``'s fresh memory reads as zeros, which a softmax over a million columns is within the tolerance of)
FILLS = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
                   "empty_strided", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
                   "fill", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_"})
SAMPLES = 4096  # positions at which an output is compared with what PyTorch computed (all of a smaller one)
# PyTorch's results of an output's size sampled in one forward (16 KB each at most); past it the forward cannot be
# read (an honest one makes tens to hundreds): the judge then takes the answer for PyTorch's (round 15: a flood of
# results ran a first-come budget out before the answer was made)
MAX_SAMPLED = 50_000
# live tensors a kernel's result is compared with, in one forward, to see whether an op undid the kernel's work; past
# it the results stay the kernel's (an honest forward compares tens to thousands; the budget bounds a flood's cost)
MAX_UNDO_VISITS = 50_000
# The counts a report carries (DataflowTrace.stats): the judge keeps these and nothing else of what a runner sends
# (round 19: 50,000 made-up counts of 120 characters made a 6.6 MB result, and in 4-byte characters one past the
# protocol's limit, which restarted the judge)
REPORT_COUNTS = ("launches", "kernel_writes", "copies", "constant_writes", "tainted_ops", "pytorch_ops", "undone",
                 "undo_visits", "undo_unchecked", "unsampled", "unsampleable")


def launch_tensors(args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a launch was given: arguments, lists and tuples of them, and the base tensor of a descriptor
    (Triton's TensorDescriptor holds it in ``base``: a TMA kernel writes through it)."""
    found: list[torch.Tensor] = []
    for leaf in tree_leaves((list(args), dict(kwargs))):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        elif isinstance(getattr(leaf, "base", None), torch.Tensor):
            found.append(leaf.base)
    return found


def _storage(t: torch.Tensor) -> Any:
    """The storage that holds ``t``'s values: a sparse tensor's is its values' (it has none of its own)."""
    if t.layout == torch.sparse_coo:
        return t._values().untyped_storage()
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return t.values().untyped_storage()
    return t.untyped_storage()


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return _storage(t)._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # nested and other storage-less layouts
        return None


class DataflowTrace(TorchDispatchMode):
    """One traced forward (module docstring). ``internal``: a context manager under which our own launches (the
    device digest's kernel) run uncounted and untraced; ``previous``: the first run's ``writes``."""

    def __init__(self, atol: float, rtol: float, internal: Callable[[], Any],
                 previous: dict[str, list[Fingerprint]] | None = None, numels: list[int] | None = None) -> None:
        super().__init__()
        self.atol, self.rtol = atol, rtol
        self.numels = set(numels) if numels else None  # the outputs' sizes: results of another size are not sampled
        self.internal = internal
        self.previous = previous
        self.tainted: dict[int, StorageWeakRef] = {}
        self.live: list[weakref.ref] = []  # untainted tensors PyTorch made (and the inputs)
        self.by_size: dict[tuple[int, torch.dtype, torch.device], list[weakref.ref]] = {}  # the same, by kind
        self.sampled: list[tuple[int, torch.dtype, torch.Tensor]] = []  # PyTorch's results, at their positions
        self.positions: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.salt = int.from_bytes(os.urandom(4), "little")  # positions no source can aim at ahead of the call
        self.inputs: set[int] = set()  # the forward's inputs' storages
        # storages a launch filled with a copy of input data (weak references hold their addresses: no new storage
        # can take one while it is listed)
        self.moved: dict[int, StorageWeakRef] = {}
        self.writes: dict[str, list[Fingerprint]] = {}  # "kernel#occurrence" -> what it wrote, this run
        self.occurrences: Counter[str] = Counter()
        self.quiet = 0  # > 0 inside a candidate's launch or our own bookkeeping: ops run, unrecorded
        self.stats: Counter[str] = Counter()

    # --- the state of a tensor ----------------------------------------------------------------------------------

    def is_tainted(self, t: torch.Tensor) -> bool:
        key = _storage_key(t)
        if key is None:
            return True  # what cannot be followed is taken as the candidate's: no verdict rests on it
        ref = self.tainted.get(key)
        return ref is not None and not ref.expired()

    def _taint(self, t: torch.Tensor) -> None:
        key = _storage_key(t)
        if key is not None:
            self.tainted[key] = StorageWeakRef(_storage(t))

    def _untaint(self, t: torch.Tensor) -> None:
        """``t`` holds PyTorch's values now: its storage is untainted where ``t`` covers all of it (a view over part
        of it leaves what a kernel wrote elsewhere in it tainted; round 15)."""
        key = _storage_key(t)
        if key is not None and t.layout == torch.strided and t.numel() * t.element_size() == _storage(t).nbytes():
            self.tainted.pop(key, None)

    def _moved(self, t: torch.Tensor) -> bool:
        ref = self.moved.get(_storage_key(t))
        return ref is not None and not ref.expired()

    def _fingerprint(self, t: torch.Tensor, values: bool = False) -> Fingerprint:
        """The tensor's bytes, digested; with ``values`` of its values (-0.0 as 0.0: ``x * 0`` is no input's)."""
        with self._bookkeeping():
            if values and t.is_floating_point():
                t = t + 0.0  # -0.0 + 0.0 is 0.0 (one temporary, where torch.where made two)
            return t.numel(), str(t.dtype), digest_of(t, 0, 0, on_device=t.is_cuda)

    def add_input(self, t: torch.Tensor) -> None:
        """One of the forward's inputs: PyTorch's, and the data a data-movement problem's answer is made of."""
        self.inputs.add(_storage_key(t))
        self.remember(t)

    def remember(self, t: torch.Tensor, computed: bool = False) -> None:
        """``t`` is PyTorch's: a source a kernel's copy is compared with; ``computed`` (a result an op computed from
        tensors, not a view, an input or a factory's fill): one an output is compared with too, in its logical order
        and, where its layout differs, in its memory's (``x.t() * 2`` is laid out as the answer of ``(x * 2).t()``)."""
        self.live.append(weakref.ref(t))
        self.by_size.setdefault((t.numel(), t.dtype, t.device), []).append(self.live[-1])
        if not computed or not t.numel() or (self.numels is not None and t.numel() not in self.numels):
            return
        if len(self.sampled) >= MAX_SAMPLED:
            self.stats["unsampled"] += 1
            return
        with self._bookkeeping():
            try:
                self.sampled.append((t.numel(), t.dtype, self._sample(t)))
                if not t.is_contiguous() and _dense(t):
                    memory = t.as_strided((t.numel(),), (1,), t.storage_offset())
                    self.sampled.append((t.numel(), t.dtype, self._sample(memory)))
            except (RuntimeError, NotImplementedError):  # a sparse or other strideless layout: no flat values
                self.stats["unsampleable"] += 1

    def _sample(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.numel(), t.device)
        if key not in self.positions:
            if t.numel() <= SAMPLES:
                self.positions[key] = torch.arange(t.numel(), device=t.device)
            else:
                generator = torch.Generator().manual_seed(self.salt ^ t.numel())
                self.positions[key] = torch.randint(t.numel(), (SAMPLES,), generator=generator).to(t.device)
        return t.detach().reshape(-1)[self.positions[key]]

    def _matches_sampled(self, t: torch.Tensor, exact: bool = False) -> bool:
        """Whether ``t`` matches, at the sampled positions, a result PyTorch computed (in another floating dtype
        too: a kernel that casts PyTorch's float64 answer only moves it); within the tolerance, or ``exact``ly."""
        if t.layout != torch.strided:
            return False
        with self._bookkeeping():
            mine = None
            for numel, dtype, values in self.sampled:
                same_kind = dtype == t.dtype or (dtype.is_floating_point and t.is_floating_point())
                if numel == t.numel() and same_kind and values.device == t.device:
                    mine = self._sample(t) if mine is None else mine
                    theirs = values if values.dtype == mine.dtype else values.to(mine.dtype)
                    if _same(mine, theirs) if exact else _close(mine, theirs, self.atol, self.rtol):
                        return True
        return False

    @contextlib.contextmanager
    def _bookkeeping(self) -> Iterator[None]:
        self.quiet += 1
        try:
            with self.internal():
                yield
        finally:
            self.quiet -= 1

    # --- aten ops -----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.quiet:
            return func(*args, **kwargs)
        worked = self.stats["kernel_writes"]
        out = func(*args, **kwargs)
        schema = func._schema
        # what the op reads: its tensor arguments but an out= tensor, which it only writes (round 15: PyTorch's answer
        # written with out= onto a buffer a kernel had scribbled on was the kernel's)
        write_only = {a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None
                      and a.alias_info.is_write}
        shown = list(args)
        if func.overloadpacket.__name__ in OVERWRITES and shown:  # ``dst.copy_(src)``, ``dst.fill_(v)``: dst unread
            shown[0] = None
        reads = [t for t in tree_leaves((shown, {k: v for k, v in kwargs.items() if k not in write_only}))
                 if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        written = [a for a, arg in zip(args, schema.arguments, strict=False)
                   if arg.alias_info is not None and arg.alias_info.is_write and isinstance(a, torch.Tensor)]
        written += [t for t in tree_leaves([kwargs.get(name) for name in write_only]) if isinstance(t, torch.Tensor)]
        # an op whose body a kernel's work went into (a torch.library custom op around a Triton kernel) is theirs
        # whatever its inputs were; one whose launches only copied or wrote constants is not (round 15)
        views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        if self.stats["kernel_writes"] != worked or any(self.is_tainted(t) for t in reads):
            self.stats["tainted_ops"] += 1
            for t in {id(t): t for t in outputs + written}.values():
                if not views and self._undone(t):
                    self.moved.pop(_storage_key(t), None)
                    self._untaint(t)
                    self.remember(t)  # a source, not a result sampled: its value is one PyTorch holds already
                else:
                    self._taint(t)
            return out
        self.stats["pytorch_ops"] += 1
        for t in written:
            self.moved.pop(_storage_key(t), None)  # PyTorch's values now, not the input's moved
        for t in outputs:
            self._untaint(t)  # an out= tensor PyTorch filled whole
            # a view's values were sampled where its base was made; a factory's (empty, zeros, full) follow no input
            self.remember(t, computed=not views and bool(reads) and func.overloadpacket.__name__ not in FILLS)
        return out

    def _undone(self, t: torch.Tensor) -> bool:
        """Whether ``t``, an op's result over a kernel's, holds none of the kernel's work: its whole value is exactly
        (at ``SAMPLES`` places first, then whole) that of a live tensor PyTorch holds untainted: same dtype, same
        number of elements, in logical order.

        Only a result that covers its whole storage, densely: taint is per storage, and a view over part of one (a
        slice, ``out[0] = ...``) equal to PyTorch's value says nothing of what a kernel wrote in the rest. A view op's
        result is never checked (it computes nothing: a kernel's transposed copy viewed back is the kernel's move,
        judged where the launch wrote it). An in-place op's target is, where it covers its storage: nothing a kernel
        wrote is left in it (``h.mul_(0.5)`` is ``h * 0.5``). Floating and integer dtypes only: a bool (a mask) is
        too often equal to another by chance, and the op that applies it is checked instead."""
        try:
            if (t.layout != torch.strided or not t.numel() or t.dtype == torch.bool or t.is_complex()
                    or t.is_quantized or t.storage_offset() or not _dense(t)
                    or t.numel() * t.element_size() != _storage(t).nbytes()):
                return False
        except (RuntimeError, NotImplementedError, AttributeError):  # nested and other storage-less layouts
            return False
        refs = self.by_size.get((t.numel(), t.dtype, t.device))
        if not refs:
            return False
        if self.stats["undo_visits"] + len(refs) > MAX_UNDO_VISITS:
            self.stats["undo_unchecked"] += 1  # the result stays the kernel's: no false verdict, and no stall
            return False
        self.stats["undo_visits"] += len(refs)
        refs[:] = [ref for ref in refs if ref() is not None]
        key, mine = _storage_key(t), None
        with self._bookkeeping():
            for s in [ref() for ref in refs]:
                if s is None or s.layout != torch.strided or _storage_key(s) == key or self.is_tainted(s):
                    continue
                mine = self._sample(t) if mine is None else mine
                if _same(mine, self._sample(s)) and _same(t.reshape(-1), s.reshape(-1)):
                    self.stats["undone"] += 1
                    return True
        return False

    # --- the candidate's launches -------------------------------------------------------------------------------

    def launch(self, kernel: str, args: Any, kwargs: dict[str, Any], run: Callable[[], Any]) -> Any:
        """Run one of the candidate's launches and mark what it wrote (module docstring)."""
        given = launch_tensors(args, kwargs)
        before = [self._fingerprint(t) for t in given]
        self.quiet += 1
        try:
            result = run()
            if any(t.is_cuda for t in given):  # a side stream's writes land before they are read
                torch.cuda.synchronize()
        finally:
            self.quiet -= 1
        after = [self._fingerprint(t) for t in given]
        changed = [t for t, b, a in zip(given, before, after, strict=True) if b != a]
        unchanged = [t for t, b, a in zip(given, before, after, strict=True) if b == a]
        # what it returned that is none of what it was given (an extension's new tensor; a view of an argument is
        # that argument's change)
        storages = {_storage_key(g) for g in given}
        returned = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor) and _storage_key(t) not in storages]
        wrote = changed + returned
        self.occurrences[kernel] += 1
        slot = f"{kernel}#{self.occurrences[kernel]}"
        prints = [self._fingerprint(t, values=True) for t in wrote]
        self.writes[slot] = prints
        self.stats["launches"] += 1
        constant = self.previous is not None and bool(prints) and self.previous.get(slot) == prints
        for t in wrote:
            if constant:
                self.stats["constant_writes"] += 1
                self._untaint(t)
                continue
            source = self._copy_of(t, unchanged)
            if source is not None or self._matches_sampled(t, exact=True):
                self.stats["copies"] += 1
                self._untaint(t)
                if source is not None and _storage_key(source) in self.inputs:
                    self.moved[_storage_key(t)] = StorageWeakRef(_storage(t))
            else:
                self.stats["kernel_writes"] += 1
                self._taint(t)
        return result

    def _copy_of(self, t: torch.Tensor, sources: list[torch.Tensor]) -> torch.Tensor | None:
        """The untainted tensor PyTorch holds whose whole value ``t``'s is, or None. Exactly: a move keeps the bits,
        and a kernel whose real work is within the tolerance of its input (a BatchNorm with fresh running
        statistics) is work that PyTorch's ops after it carry on from (round 15)."""
        key = _storage_key(t)
        self.live = [ref for ref in self.live if ref() is not None]
        live = [ref() for ref in self.live]
        with self._bookkeeping():
            for s in sources + [s for s in live if s is not None]:
                if (s.numel() != t.numel() or s.dtype != t.dtype or s.device != t.device or _storage_key(s) == key
                        or s.layout != torch.strided or t.layout != torch.strided or self.is_tainted(s)):
                    continue
                if _same(t.reshape(-1), s.reshape(-1)):
                    return s
        return None

    def report(self, outputs: list[torch.Tensor]) -> dict[str, Any]:
        """What the judge reads: which outputs no kernel's work reached, which PyTorch had computed anyway, and the
        counts behind them."""
        # an output a launch filled with input data (a transpose, a crop: the problem is data movement) is the
        # kernel's work; PyTorch computing on such a copy is not (the copy is PyTorch's input)
        untainted = [k for k, t in enumerate(outputs) if not self.is_tainted(t) and not self._moved(t)]
        computed = [k for k, t in enumerate(outputs) if k not in untainted and self._matches_sampled(t)]
        return {"untainted": untainted, "computed": computed, "outputs": len(outputs),
                "overflow": bool(self.stats["unsampled"]), **{k: int(v) for k, v in self.stats.items()}}


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory one each (a permutation of a contiguous layout)."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride(), strict=True) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    if a.is_floating_point() or a.is_complex():
        return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())
    return bool(torch.equal(a, b))
