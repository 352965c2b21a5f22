"""Where the answer comes from: one untimed forward traced op by op, the candidate's kernels running.

The knockout (launches.py) tests that the answer *depends on* the candidate's kernels; a kernel that only moves
PyTorch's answer passes it (round 13: PyTorch computes the whole answer and a Triton kernel copies it into an
``empty_like`` buffer, moves one element of it into a NaN-filled output, or writes the 1.0 it is multiplied by).
This trace asks instead whether PyTorch computed the answer. Every aten op runs under a ``TorchDispatchMode`` and
every launch of the candidate's own kernels (a Triton JIT function, an extension's function) through
``DataflowTrace.launch``. A tensor is the candidate's ("tainted", by storage) once a launch wrote it, and an op's
outputs are tainted where one of its inputs is. What a launch writes does *not* taint where it adds nothing:

- a copy: the written tensor's whole value equals (within the problem's tolerance) a tensor PyTorch holds
  untainted (a live one, or one of the launch's unchanged arguments), or matches one PyTorch computed earlier at
  ``SAMPLES`` random positions;
- a constant of the inputs: the same launch (the kernel and its occurrence in the forward) wrote the same values
  on the other input set (the trace runs twice, on two seeds: ``previous`` holds the first run's writes).

An output is PyTorch's where it is untainted at the end, or where its values match, at ``SAMPLES`` random positions
and within the tolerance, an untainted tensor some PyTorch op computed (the answer existed before any kernel
touched it: a kernel that adds negligible values to it, or moves it, changes nothing). Every output PyTorch's:
``token_kernel``. Partial fusion is left alone: an answer written by a kernel, or by a PyTorch op over a kernel's
output, is the kernel's, unless PyTorch had computed it whole anyway.

Like the knockout, this runs in the candidate's process and is its report: defence in depth. What it does not
catch (docs/integrity.md, Open): a kernel doing real but undone work (writes ``2 x``, PyTorch computes on half of
it), a copy split over launches and finished by PyTorch, writes through pointers to tensors the launch was not
given, and a candidate that tells the traced call (an active dispatch mode) and behaves there.
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
SAMPLES = 4096  # positions at which an output is compared with what PyTorch computed (all of a smaller one)
MAX_SAMPLED = 20_000  # PyTorch's tensors sampled in one forward (16 KB each at most)


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


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):  # sparse and other storage-less layouts
        return None


class DataflowTrace(TorchDispatchMode):
    """One traced forward (module docstring). ``internal``: a context manager under which our own launches (the
    device digest's kernel) run uncounted and untraced; ``previous``: the first run's ``writes``."""

    def __init__(self, atol: float, rtol: float, internal: Callable[[], Any],
                 previous: dict[str, list[Fingerprint]] | None = None) -> None:
        super().__init__()
        self.atol, self.rtol = atol, rtol
        self.internal = internal
        self.previous = previous
        self.tainted: dict[int, StorageWeakRef] = {}
        self.live: list[weakref.ref] = []  # untainted tensors PyTorch made (and the inputs)
        self.sampled: list[tuple[int, torch.dtype, torch.Tensor]] = []  # PyTorch's results, at their positions
        self.positions: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.salt = int.from_bytes(os.urandom(4), "little")  # positions no source can aim at ahead of the call
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
            self.tainted[key] = StorageWeakRef(t.untyped_storage())

    def _untaint(self, t: torch.Tensor) -> None:
        key = _storage_key(t)
        if key is not None:
            self.tainted.pop(key, None)

    def _fingerprint(self, t: torch.Tensor, values: bool = False) -> Fingerprint:
        """The tensor's bytes, digested; with ``values`` of its values (-0.0 as 0.0: ``x * 0`` is no input's)."""
        with self._bookkeeping():
            if values and t.is_floating_point():
                t = torch.where(t == 0, torch.zeros_like(t), t)
            return t.numel(), str(t.dtype), digest_of(t, 0, 0, on_device=t.is_cuda)

    def remember(self, t: torch.Tensor, computed: bool = False) -> None:
        """``t`` is PyTorch's: a source a kernel's copy is compared with; ``computed`` (an op's result, not a view or
        an input): one an output is compared with too."""
        self.live.append(weakref.ref(t))
        if computed and t.numel() > 1 and len(self.sampled) < MAX_SAMPLED:
            with self._bookkeeping():
                self.sampled.append((t.numel(), t.dtype, self._sample(t)))

    def _sample(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.numel(), t.device)
        if key not in self.positions:
            if t.numel() <= SAMPLES:
                self.positions[key] = torch.arange(t.numel(), device=t.device)
            else:
                generator = torch.Generator().manual_seed(self.salt ^ t.numel())
                self.positions[key] = torch.randint(t.numel(), (SAMPLES,), generator=generator).to(t.device)
        return t.detach().reshape(-1)[self.positions[key]]

    def _matches_sampled(self, t: torch.Tensor) -> bool:
        """Whether ``t`` matches, at the sampled positions, a result PyTorch computed."""
        with self._bookkeeping():
            mine = None
            for numel, dtype, values in self.sampled:
                if numel == t.numel() and dtype == t.dtype and values.device == t.device:
                    mine = self._sample(t) if mine is None else mine
                    if _close(mine, values, self.atol, self.rtol):
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
        launched = self.stats["launches"]
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        schema = func._schema
        written = [a for a, arg in zip(args, schema.arguments, strict=False)
                   if arg.alias_info is not None and arg.alias_info.is_write and isinstance(a, torch.Tensor)]
        # an op whose body launched the candidate's kernels (a torch.library custom op around a Triton kernel) is
        # theirs whatever its inputs were
        if self.stats["launches"] != launched or any(self.is_tainted(t) for t in inputs):
            self.stats["tainted_ops"] += 1
            for t in outputs + written:
                self._taint(t)
            return out
        self.stats["pytorch_ops"] += 1
        views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        for t in outputs:
            self.remember(t, computed=not views)  # a view's values were sampled where its base was made
        return out

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
            elif self._copies(t, unchanged) or self._matches_sampled(t):
                self.stats["copies"] += 1
                self._untaint(t)
            else:
                self.stats["kernel_writes"] += 1
                self._taint(t)
        return result

    def _copies(self, t: torch.Tensor, sources: list[torch.Tensor]) -> bool:
        """Whether ``t``'s whole value is, within the tolerance, that of an untainted tensor PyTorch holds."""
        key = _storage_key(t)
        self.live = [ref for ref in self.live if ref() is not None]
        live = [ref() for ref in self.live]
        with self._bookkeeping():
            for s in sources + [s for s in live if s is not None]:
                if (s.numel() != t.numel() or s.dtype != t.dtype or s.device != t.device or _storage_key(s) == key
                        or self.is_tainted(s)):
                    continue
                if _close(t.reshape(-1), s.reshape(-1), self.atol, self.rtol):
                    return True
        return False

    def report(self, outputs: list[torch.Tensor]) -> dict[str, Any]:
        """What the judge reads: which outputs no kernel's work reached, which PyTorch had computed anyway, and the
        counts behind them."""
        untainted = [k for k, t in enumerate(outputs) if not self.is_tainted(t)]
        computed = [k for k, t in enumerate(outputs) if k not in untainted and self._matches_sampled(t)]
        return {"untainted": untainted, "computed": computed, "outputs": len(outputs),
                **{k: int(v) for k, v in self.stats.items()}}


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    if a.is_floating_point() or a.is_complex():
        return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())
    return bool(torch.equal(a, b))
