"""Runner process: ``python -m kb_gym.worker.runner --device cuda:0 --scratch DIR``.

The only process that ever runs candidate code, and it runs one candidate, then it is killed. The
judge starts it before it is needed (a pristine spare), so start-up is off the critical path. It
holds nothing that decides a verdict: no reference outputs, no comparison, no believed clock, no
channel to the evaluator, no cache or store it may write. It is told seeds, builds the problem's
inputs from them, runs ``ModelNew`` and hands back plain tensors and its own event times, which
the judge checks against its own clock. Everything here can be rewritten by the candidate; nothing
here has to be trusted.

Sandbox (set up in serve(), before any candidate code): fresh PID, network and mount namespaces from the
judge's ``unshare`` prefix, a private size-limited /dev/shm, Landlock allowing writes only in the
scratch folder (and the GPU's device files) and reads only of the Python installation and system
folders (not the results store, the caches, /tmp or home folders), seccomp refusing new sockets,
ptrace, mounts, device nodes, modules, clock setting, the keyring and other architectures' calls
(seccomp.py), a minimal environment.
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kb_gym.worker import (
    capabilities,
    device_digest,
    device_payload,
    header_diet,
    native_guard,
    pch,
    triton_launchers,
)
from kb_gym.worker.build_cache import may_build
from kb_gym.worker.clock import CacheFlusher, probe_call, timed_call
from kb_gym.worker.dataflow import DataflowTrace
from kb_gym.worker.inputs import DTYPES, clone_inputs, init_inputs_of, init_model, make_inputs
from kb_gym.worker.landlock import restrict_writes
from kb_gym.worker.launch_shim import Shim
from kb_gym.worker.launches import LaunchCounter
from kb_gym.worker.loading import (
    OUT_OF_DEVICE_MEMORY,
    StageError,
    check_signature,
    load_module,
    out_of_device_memory,
    sticky_cuda_error,
    trim_traceback,
)
from kb_gym.worker.payload import SHM_MIN_BYTES, PayloadWriter
from kb_gym.worker.process import (
    ENV_GPU,
    RUNNER_OOM_SCORE,
    bind_scratch,
    limit_sysv_ipc,
    private_shm,
    set_limits,
    take_protocol_fds,
)
from kb_gym.worker.protocol import LANDLOCK_BREAKS_CUDA, MessageReader, ProtocolError, write_message
from kb_gym.worker.seccomp import deny_escape_syscalls
from kb_gym.worker.spot_check import chunk_hashes
from kb_gym.worker.tensors import (
    commitment,
    describe,
    flatten_bytes,
    flatten_plain,
    host_bytes,
    on_host,
    output_form,
)
from kb_gym.worker.triton_cache import uses_triton

SHM_MB = 64


# Of /etc, what the loader, Python, compilers and the CUDA driver read; not /etc/shadow or credentials.
_ETC = tuple(f"/etc/{name}" for name in (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "passwd", "group", "nsswitch.conf",
    "hosts", "host.conf", "os-release", "alternatives", "mime.types", "ssl", "ca-certificates", "gai.conf",
    "nvidia", "OpenCL", "vulkan", "glvnd", "debian_version", "lsb-release", "environment"))


def _readable_roots() -> list[str]:
    """Folders a candidate may read: the interpreter, its packages, system libraries and tools."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(sysconfig.get_paths().values()), "/usr", "/lib", "/lib64", "/bin", "/sbin", "/opt",
             "/proc", "/sys", "/dev", "/run/nvidia-persistenced", *_ETC}
    roots.update(p for p in sys.path if p and os.path.isdir(p))
    import kb_gym  # editable installs map the package to a source folder: only the package itself

    roots.update(os.path.dirname(p) if p.endswith("__init__.py") else p for p in kb_gym.__path__)
    for name in ("CUDA_HOME", "CUDA_PATH", pch.ENV_DIR):  # the PCH folder: read, never written (pch.py)
        if os.environ.get(name) and os.path.isdir(os.environ[name]):
            roots.add(os.environ[name])
    # A folder that holds a user's files must not be readable whole: the home folder (results store,
    # caches), /tmp, the work tree. The package folders above are named one by one instead.
    home = os.path.expanduser("~")
    return sorted(r for r in roots if r and r not in ("/", home, "/tmp", tempfile.gettempdir()))


def _confine(scratch: Path, device: str) -> dict[str, Any]:
    mode = os.environ.get("KB_GYM_LANDLOCK", "auto").lower()
    if mode in ("0", "off"):
        return {"landlock": 0}
    reads = None if os.environ.get("KB_GYM_RUNNER_READS", "1") == "0" else _readable_roots()
    writable = [str(scratch), f"/proc/{os.getpid()}", "/dev/shm"]
    writable += ["/dev"] if device != "cpu" else ["/dev/null"]
    return restrict_writes(writable, readable=reads)


def _scratch_env(scratch: Path) -> None:
    for name, sub in (("TMPDIR", "tmp"), ("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("CUDA_CACHE_PATH", "nv"), ("TORCH_EXTENSIONS_DIR", "ext"), ("HOME", "home")):
        path = scratch / sub
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    tempfile.tempdir = os.environ["TMPDIR"]


def _changed(inputs: list[Any], pristine: list[Any]) -> bool:
    """Whether a forward wrote to its tensor inputs: ``pristine`` holds what they held before (a copy, or the same
    inputs made again from their seed)."""
    return any(isinstance(a, torch.Tensor) and not _same(a, b) for a, b in zip(inputs, pristine, strict=True))


def _same(a: torch.Tensor, b: Any) -> bool:
    """Equal values, NaN where NaN was (``torch.equal`` calls a NaN unequal to itself: every honest call on inputs that
    hold one read as a write to them, round 36)."""
    if torch.equal(a, b):
        return True
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all().item())


def _state_bytes(model: Any) -> int:
    """The bytes of a module's parameters and buffers (0 for anything else): what a copy of it holds beside it."""
    if not isinstance(model, torch.nn.Module):
        return 0
    tensors = [*model.parameters(), *model.buffers()]
    # a lazy layer's parameters hold nothing until its first call (and have no numel)
    return sum(t.numel() * t.element_size() for t in tensors if not torch.nn.parameter.is_lazy(t))


class Runner:
    """The commands a runner answers: ping, load, call, timed."""

    def __init__(self, device: str, scratch: Path, send: Any, send_tensors: Any, pch_root: Path | None = None,
                 premap: Callable[[], float] | None = None) -> None:
        self.device = torch.device(device)
        self.premap = premap  # maps the memfd as the judge sized it (payload.PayloadWriter.premap)
        self.pch_root = pch_root  # set only where Landlock keeps this process from writing there
        self.scratch = scratch
        self.send = send
        self.send_tensors = send_tensors
        self.counter = LaunchCounter(device_kernels_only=self.device.type == "cuda")
        if self.device.type == "cuda":
            self.counter.shim = Shim.preloaded()  # there where the judge started this runner with it
            if self.counter.shim is not None:
                self.counter.shim.set_root(str(scratch))  # the candidate's builds are here and only here
        self.counter.install()
        self.flusher = CacheFlusher(self.device)
        self.ref_mod: Any = None
        self.ref_model: Any = None
        self.model: Any = None
        self.dtype: Any = None
        self.numerics: tuple[Any, ...] = ()
        self.candidate_file = ""
        self.forward_checked = False
        self.held: list[Any] = []  # a sampled call's outputs, until the judge has asked for its chunks
        self.dataflow_writes: dict[str, Any] | None = None  # the first traced run's launches' writes (dataflow.py)
        self.dataflow_report: dict[str, Any] | None = None  # the last traced run's, sent with its "done"
        self.burst_held: list[list[Any]] = []  # a burst's outputs, until the judge has drawn the ones it checks
        # the last timed call's inputs and how they were made (seed, widen), until the next call: the judge asks, once
        # the call's outputs are the judge's, whether they still hold what the seed makes (``_inputs``)
        self.last_inputs: tuple[int, bool, list[Any]] | None = None
        # ... and its outputs, held with the garbage collector off until then: candidate code runs when the last
        # reference to an object it made goes (a generator's ``finally`` parked on its output), and it put its inputs
        # back there, between "done" and the question (round 36)
        self.last_outputs: list[Any] | None = None
        self.collect_after = False  # the collector was on before that call: on again once they go
        self.harness_outputs: Any = None  # a pristine spare's reference outputs for its harness-only calls
        self.pch: dict[str, list[str]] | None = None  # the PCH variants the candidate's builds used and wanted
        self.launchers: list[dict[str, Any]] | None = None  # Triton launchers asked for (triton_launchers.py)
        self.launchers_sent = 0  # of them, how many replies carried already

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind not in ("inputs", "chunks"):  # the judge asks of the last timed call's inputs no more
            self._release_call()
        if kind == "ping":
            self.send({"type": "pong"})
        elif kind == "prepare":
            self.send(self._prepare(msg))
        elif kind == "load":
            self.send(self._load(msg))
        elif kind == "load_forward":
            spec = msg.get("spec")
            ran = self._load_forward(spec) if isinstance(spec, dict) and self.model is not None else {
                "ran": False, "why": "no candidate loaded"}
            self.send({"type": "load_forward", **ran})
        elif kind in ("call", "timed"):
            self._call(msg, timed=kind == "timed")
        elif kind == "chunks":
            self._send_chunks(msg)
        elif kind == "burst":
            self._burst(msg)
        elif kind == "burst_outputs":
            self._send_burst_outputs(msg)
        elif kind == "inputs":
            self._inputs()
        else:
            self.send({"type": "error", "status": "crash", "error": f"unknown command {kind!r}"})

    def _prepare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The problem alone, while this runner is still pristine: its inputs, and the reference model
        for the calls that measure this process's own per-call overhead before any candidate code runs."""
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(msg.get("tf32"))
        self.numerics = _numerics()
        self.harness_outputs = None
        self.dtype = DTYPES[msg["precision"]]
        ref_path = self.scratch / "reference.py"
        ref_path.write_text(msg["problem_code"])
        os.chdir(self.scratch)
        try:
            self.ref_mod = load_module(ref_path, "kb_reference")
            if msg.get("reference_model"):
                self.ref_model = init_model(self.ref_mod, self.ref_mod.Model, int(msg["init_seed"]), self.device,
                                            self.dtype)
        except Exception as exc:  # noqa: BLE001
            return {"type": "prepared", "status": "runtime_error",
                    "error": "the reference problem failed to load: " + trim_traceback(exc, "")}
        # the memfd's pages for outputs of the size the judge expects, allocated before the candidate and outside
        # the device lock (the judge sized it before this message)
        mapped = self.premap() if msg.get("payload_bytes") and self.premap is not None else 0.0
        return {"type": "prepared", "status": "ok", "payload_premap_s": mapped}

    def _load(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.ref_model = None  # candidate code runs from here on: nothing measured here is trusted again
        cand_path = self.scratch / "candidate.py"
        cand_path.write_text(msg["source"])
        self.candidate_file = str(cand_path)
        self.headers: list[str] = []  # the header diet of each CUDA build (header_diet.py)
        builds = may_build(msg["source"])
        if builds and os.environ.get(header_diet.ENV_SWITCH, "1") != "0":
            header_diet.install(self.headers)
        native_guard.install()  # outermost (a build named by a computed name too): reads what the candidate passes
        self.pch = pch.install(self.pch_root) if self.pch_root is not None and builds else None
        if uses_triton(msg["source"]):
            self.launchers = triton_launchers.record()
        try:
            cand_mod = load_module(cand_path, "kb_candidate")
        except BaseException as exc:  # noqa: BLE001
            return {"type": "loaded", "status": "compile_error", "error": trim_traceback(exc, str(cand_path)),
                    "pch": self.pch, "headers": self.headers}
        cls = getattr(cand_mod, "ModelNew", None)
        if not isinstance(cls, type):
            return {"type": "loaded", "status": "format_error", "error": "the code runs but defines no class ModelNew"}
        seed = int(msg["init_seed"])
        try:
            check_signature(cls, "__init__", init_inputs_of(self.ref_mod, seed), self.ref_mod.Model)
        except StageError as exc:
            return {"type": "loaded", "status": exc.status, "error": exc.message}
        try:
            self.model = init_model(self.ref_mod, cls, seed, self.device, self.dtype)
        except BaseException as exc:  # noqa: BLE001
            return {"type": "loaded", "status": "compile_error",
                    "error": "constructing ModelNew failed:\n" + trim_traceback(exc, str(cand_path))}
        if not callable(self.model):
            return {"type": "loaded", "status": "compile_error", "error": "ModelNew(...) is not callable"}
        return {"type": "loaded", "status": "ok", "pch": self.pch, "headers": self.headers}

    def _load_forward(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One forward at the end of the load, outside the device lock (load_forward.py; a request of its own, so the
        judge knows while it runs: neighbours.PauseWatcher.forward): what a first call compiles or starts (Triton's
        kernels, cuBLAS's handle, cuDNN's plans) is then done before the judge holds the device.
        Its inputs come from a seed of the judge's own, never a trial's; its outputs are dropped unread; whatever it
        raises is left for the trials to find. Skipped where its inputs and outputs would pass ``max_bytes``."""
        began = time.perf_counter()
        try:
            sizes = make_inputs(self.ref_mod, int(spec["seed"]), torch.device("meta"), self.dtype)
            held = sum(x.numel() * x.element_size() for x in sizes if isinstance(x, torch.Tensor))
        except Exception:  # noqa: BLE001 - inputs the meta device cannot make: their size is unknown
            return {"ran": False, "why": "the inputs' size is unknown"}
        held += int(spec["output_bytes"])
        try:
            state = _state_bytes(self.model)
        except BaseException as exc:  # noqa: BLE001 - the candidate's own module: what a copy would hold is unknown
            return {"ran": False, "why": f"its state's size is unknown: {type(exc).__name__}"}
        if held + state > int(spec["max_bytes"]):
            return {"ran": False, "why": f"{held + state} bytes"}
        why = ""
        try:
            # On a copy: a first call may change its model (a lazy layer's weights drawn then, a scale calibrated on
            # the first batch), and the trials must meet the model the reference meets, never one a call ahead of it
            # (round 37). What the call warms belongs to the process: compiled kernels, library handles, builds.
            model = copy.deepcopy(self.model)
        except BaseException as exc:  # noqa: BLE001 - not copied: no forward, the trials as without it
            return {"ran": False, "why": f"not copied: {type(exc).__name__}"}
        try:
            inputs = make_inputs(self.ref_mod, int(spec["seed"]), self.device, self.dtype)
            with torch.no_grad():
                model(*inputs)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except BaseException as exc:  # noqa: BLE001 - the trials meet it again and give it its verdict (a SystemExit too)
            why = type(exc).__name__
        finally:
            model = inputs = None
        return {"ran": True, "why": why, "seconds": round(time.perf_counter() - began, 4)}

    def _call(self, msg: dict[str, Any], timed: bool) -> None:
        # "forward": the reference as "reference" is, but a probe call leaves it unshielded (probe_check.py)
        reference = msg.get("target") in ("reference", "harness", "forward")
        model = self.ref_model if reference else self.model
        if msg.get("target") == "harness" and model is not None:  # a pristine spare's harness alone (probe_check.py)
            model = self._held_reference
        if model is None:
            self.send({"type": "error", "status": "crash", "error": "nothing loaded to call"})
            return
        try:
            inputs = make_inputs(self.ref_mod, int(msg["seed"]), self.device, self.dtype,
                                 widen=bool(msg.get("widen")))
            pristine = clone_inputs(inputs) if msg.get("check_mutation") else None
        except Exception as exc:  # noqa: BLE001 - out of the device's memory beside a neighbour's job, above all
            # a reply, not a dead runner (an H100 batch: a reference copy's runner died copying its trial inputs): the
            # judge runs the job again alone (device_turns)
            self._send_exception(exc)
            return
        if not reference and not self.forward_checked:
            self.forward_checked = True
            bad = _forward_mismatch(self.model, self.ref_mod, inputs)
            if bad:
                self.send({"type": "error", "status": "compile_error", "error": bad})
                return
        if msg.get("knockout") and not reference:
            model = _knocked_out(model, self.counter)
        self.dataflow_report = None
        if isinstance(msg.get("dataflow"), dict) and not reference and not timed:
            model = self._traced(model, msg["dataflow"])
        self.counter.reset()
        self.counter.backends.clear()
        collecting = gc.isenabled()
        if timed:
            gc.disable()
        held = None
        try:
            held = self._respond(msg, model, inputs, pristine, timed)
        finally:
            kept = timed and not reference and held is not None
            if collecting and not kept:
                gc.enable()
        if kept:
            self.last_inputs = (int(msg["seed"]), bool(msg.get("widen")), inputs)
            self.last_outputs, self.collect_after = held, collecting

    def _release_call(self) -> None:
        """The last timed call's inputs and outputs let go (a finaliser of the candidate's may run now), the collector
        on again if it was before that call."""
        self.last_inputs = self.last_outputs = None
        if self.collect_after:
            self.collect_after = False
            gc.enable()

    def _inputs(self) -> None:
        """Whether the last timed call's inputs still hold what their seed makes: made again and compared, after the
        call's reply, outside its clock (a copy before the call would be inside the judge's envelope and the probe's
        window). The trials compare with a copy (``check_mutation``); a forward can tell them from the timed calls by
        their seeds (round 31), so the timed calls are checked too."""
        kept, self.last_inputs = self.last_inputs, None
        if kept is None:
            self.send({"type": "inputs", "mutated": False})
            self._release_call()
            return
        seed, widen, inputs = kept
        mutated = True  # a candidate that swapped an input's type or storage fails the comparison
        for attempt in range(2):
            try:
                mutated = _changed(inputs, make_inputs(self.ref_mod, seed, self.device, self.dtype, widen=widen))
                break
            except Exception as exc:  # noqa: BLE001
                again = not attempt and self.device.type == "cuda" and out_of_device_memory(exc)
            if not again:
                break
            # the call's outputs are still held (above): where the inputs made again did not fit beside them, once
            # more with the allocator's free blocks given back (outside the handler, whose traceback holds the partly
            # made inputs); out of memory twice, the inputs count as changed, as any failure here does
            torch.cuda.empty_cache()
        del inputs, kept
        self._release_call()
        # the call's young garbage collected here, outside every clock, as the inputs' remaking used to start it while
        # the collector was on: left to the next call's own allocations, it fell inside that call's CPU-clock window
        # (an honest copy on round 25's widened ReLU: charged under a whole suite's load)
        gc.collect(0)
        self.send({"type": "inputs", "mutated": mutated})

    def _held_reference(self, *inputs: Any) -> Any:
        """The reference's outputs of the first harness call, returned again as they are: the call's window then
        holds the harness's GPU work alone (building inputs, copying outputs out), no forward."""
        if self.harness_outputs is None:
            with torch.no_grad():
                self.harness_outputs = self.ref_model(*inputs)
        return self.harness_outputs

    def _respond(self, msg: dict[str, Any], model: Any, inputs: list[Any], pristine: Any,
                 timed: bool) -> list[Any] | None:
        """The call itself and its "done"; what the forward returned (in a list), or None where an error was sent. On a
        timed call the garbage collector waits until "done" is sent: a collection of the forward's garbage right after
        it (the Triton interpreter leaves much) fell outside the reported time and inside the judge's envelope (CPU:
        the honest excess of a Triton ReLU 1.9-3.1 ms against the 2 ms floor, flagged side_stream; 1.4-1.95 ms
        without it)."""
        try:
            shield_ms = None
            if timed and msg.get("probe") and self.device.type == "cuda":
                (out, event_ms, host_ms), shield_ms = probe_call(model, inputs, self.device,
                                                                 shield=msg.get("target") == "reference")
            elif timed:
                out, event_ms, host_ms = timed_call(model, inputs, self.device, self.flusher)
            else:
                with torch.no_grad():
                    out = model(*inputs)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                event_ms = host_ms = None
            structure, flat = flatten_plain(out)
            form = output_form(out)
            meta = describe(flat)
            launches, backends = self.counter.count, sorted(self.counter.backends)  # not the digest's own
            on_device = msg.get("digest") == "device" and device_digest.applies_to(self.device)
            # on the host once: hashed before "done", then sent (or held) from these copies (a probe call hashes none)
            if not on_device and msg.get("digest") != "none":
                flat = [on_host(t) for t in flat]
            chunk_bytes = int(msg.get("chunk_bytes") or 0) if timed else 0
            nonce = int(msg.get("nonce", 0))
            if chunk_bytes:
                hashes, digest = chunk_hashes(flat, nonce, chunk_bytes, on_device), None
            elif msg.get("digest") == "none":  # a probe call: its window runs until the judge holds the outputs
                hashes, digest = None, None
            else:
                hashes, digest = None, commitment(flat, nonce, on_device)
        except (TypeError, ValueError) as exc:
            if "forward returned" in str(exc):
                self.send({"type": "error", "status": "incorrect", "error": str(exc)})
                return None
            self._send_exception(exc)
            return None
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt from a candidate too
            self._send_exception(exc)
            return None
        mutated = pristine is not None and _changed(inputs, pristine)
        done = {"type": "done", "event_ms": event_ms, "host_ms": host_ms, "structure": structure, "form": form,
                "outputs": meta,
                "commitment": digest, "launches": launches, "backends": backends,
                "mutated": mutated, "numerics_changed": _numerics() != self.numerics, "shield_ms": shield_ms}
        if self.dataflow_report is not None:
            done["dataflow"] = self.dataflow_report
        if self.launchers is not None and len(self.launchers) > self.launchers_sent:  # new since the last reply
            done["launchers"] = self.launchers[self.launchers_sent:]
            self.launchers_sent = len(self.launchers)
        if hashes is not None:  # the judge picks the chunks it wants now that their hashes are fixed
            self.held = flat
            self.send({**done, "chunk_hashes": hashes, "chunk_bytes": chunk_bytes, "payload_bytes": 0})
        else:
            self.send_tensors(done, flat)
        return [out]

    def _traced(self, model: Any, spec: dict[str, Any]) -> Callable[..., Any]:
        """``model`` run under the dataflow trace (dataflow.py): phase 1 keeps what its launches wrote, phase 2
        compares with it and reports which outputs PyTorch computed alone."""
        first = spec.get("phase") == 1

        def forward(*inputs: Any) -> Any:
            numels = spec.get("numels")
            trace = DataflowTrace(float(spec["atol"]), float(spec["rtol"]), self.counter.internal,
                                  previous=None if first else self.dataflow_writes or {},
                                  numels=[int(n) for n in numels] if isinstance(numels, list) else None)
            for x in inputs:
                if isinstance(x, torch.Tensor):
                    trace.add_input(x)
            self.counter.dataflow = trace
            try:
                with trace:
                    out = model(*inputs)
            finally:
                self.counter.dataflow = None
            if first:
                self.dataflow_writes = trace.writes
            self.dataflow_report = trace.report(flatten_plain(out)[1])
            return out

        return forward

    def _send_chunks(self, msg: dict[str, Any]) -> None:
        """The bytes of the chunks the judge drew from the last sampled call's outputs, in its order."""
        size, held = int(msg.get("chunk_bytes") or 0), self.held
        self.held = []
        try:
            pieces = [flatten_bytes(held[k])[j * size:(j + 1) * size] for k, j in msg.get("want") or []]
        except (IndexError, TypeError, ValueError) as exc:
            self.send({"type": "error", "status": "crash", "error": f"bad chunk request: {exc}"})
            return
        self.send_tensors({"type": "chunk_bytes", "outputs": describe(pieces)}, pieces)

    def _burst(self, msg: dict[str, Any]) -> None:
        """Forwards back to back on fresh inputs, one per seed (built inside the judge's clock, as a timed call's
        are), no cache flush or launch shield between them; each output kept and committed before "done". The
        judge's clock around the whole burst bounds what the forwards truly cost (worker/burst.py); the event
        times reported here are believed only from a pristine runner calibrating the burst on the reference."""
        model = self.ref_model if msg.get("target") == "reference" else self.model
        self.burst_held = []
        if model is None:
            self.send({"type": "error", "status": "crash", "error": "nothing loaded to call"})
            return
        on_device = msg.get("digest") == "device" and device_digest.applies_to(self.device)
        nonce, cuda = int(msg.get("nonce", 0)), self.device.type == "cuda"
        events: list[Any] = []
        commitments, held, structure = [], [], "tensor"
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.no_grad():
                for k, seed in enumerate(msg.get("seeds") or []):
                    inputs = make_inputs(self.ref_mod, int(seed), self.device, self.dtype)
                    if cuda:
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        out = model(*inputs)
                        end.record()
                        events.append((start, end))
                    else:
                        t0 = time.perf_counter()
                        out = model(*inputs)
                        events.append((time.perf_counter() - t0) * 1e3)
                    structure, flat = flatten_plain(out)
                    describe(flat)  # a dtype that cannot be compared fails here, as in a call
                    if not on_device:
                        flat = [on_host(t) for t in flat]
                    commitments.append(commitment(flat, nonce + k, on_device))
                    held.append(flat)
                    del inputs, out
            if cuda:
                torch.cuda.synchronize(self.device)
                events = [start.elapsed_time(end) for start, end in events]
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt from a candidate too
            self._send_exception(exc)
            return
        finally:
            if collecting:
                gc.enable()
        meta = describe(held[0]) if held else []
        # a spare's burst on the reference is never drawn from: it goes on pristine, its memory free
        self.burst_held = held if msg.get("target") != "reference" else []
        del held
        self.send({"type": "burst_done", "event_ms": events, "commitments": commitments, "structure": structure,
                   "outputs": meta})

    def _send_burst_outputs(self, msg: dict[str, Any]) -> None:
        """The outputs of the burst's forwards the judge drew after its "done", in its order."""
        held, self.burst_held = self.burst_held, []
        try:
            flat = [t for k in msg.get("want") or [] for t in held[int(k)]]
            meta = describe(flat)
        except (IndexError, TypeError, ValueError) as exc:
            self.send({"type": "error", "status": "crash", "error": f"bad burst request: {exc}"})
            return
        self.send_tensors({"type": "burst_outputs", "outputs": meta}, flat)

    def _send_exception(self, exc: BaseException) -> None:
        msg = trim_traceback(exc, self.candidate_file)
        if out_of_device_memory(exc):
            msg = f"{OUT_OF_DEVICE_MEMORY}: {msg}"
        self.send({"type": "error", "status": "runtime_error", "error": msg, "sticky": sticky_cuda_error(self.device)})


def _knocked_out(model: Any, counter: LaunchCounter) -> Callable[..., Any]:
    """``model`` with the candidate's own kernels doing nothing for the length of one forward (launches.py); the
    output digest's kernel after it runs as always."""

    def forward(*inputs: Any) -> Any:
        counter.knockout = True
        try:
            return model(*inputs)
        finally:
            counter.knockout = False

    return forward


def _numerics() -> tuple[Any, ...]:
    """The global settings that change fp32 results; a candidate that changes them computes in lower precision."""
    try:
        return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision())
    except RuntimeError:  # the legacy and the new TF32 flags disagree: set through the new API
        return ("mixed",)


def _forward_mismatch(model: Any, ref_mod: Any, inputs: list[Any]) -> str | None:
    try:
        inspect.signature(type(model).forward).bind(None, *inputs)
    except TypeError as exc:
        ref_sig = inspect.signature(ref_mod.Model.forward)
        return (f"ModelNew.forward cannot take the reference's inputs ({len(inputs)} given): {exc}. "
                f"Model.forward is {ref_sig}.")
    except (ValueError, AttributeError):
        pass
    return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kb_gym.worker.runner")
    parser.add_argument("--device", required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--namespaces", action="store_true", help="started in fresh namespaces (unshare)")
    parser.add_argument("--mount-point", help="where to bind the scratch folder (build_cache.mount_point)")
    args = parser.parse_args()
    scratch = bind_scratch(args.scratch, args.mount_point) if args.namespaces else args.scratch
    serve(args.device, scratch, namespaces=args.namespaces)


def narrow_to_one_gpu(device: str) -> str:
    """Before CUDA starts here: only the judge's GPU is visible (runner_start.own_gpu), and it is ``cuda:0``."""
    gpu = os.environ.pop(ENV_GPU, "")
    if not gpu or not device.startswith("cuda"):
        return device
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return "cuda:0"


def serve(device: str, scratch_dir: str, namespaces: bool) -> None:
    """The runner's life: set up the sandbox, say ready, answer the judge until it closes the pipe.
    Entered from main() (a fresh interpreter) or from a zygote's forked child (zygote.py)."""
    started = time.perf_counter()
    phases: dict[str, float] = {}  # where a runner's start-up goes (the judge waits for it before timing)
    last = started

    def phase(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        phases[name], last = round(now - last, 4), now

    device = narrow_to_one_gpu(device)
    proto_in, proto_out = take_protocol_fds()
    set_limits(file_bytes=1 << 30, oom_score=RUNNER_OOM_SCORE)
    scratch = Path(scratch_dir)
    _scratch_env(scratch)
    shm = os.environ.get("KB_GYM_RUNNER_PRIVATE_SHM") == "1" and private_shm(SHM_MB)
    sysv = limit_sysv_ipc(SHM_MB)
    # After the mount (it needs CAP_SYS_ADMIN), before any thread exists. KB_GYM_DROP_CAPS=0 keeps them.
    caps = capabilities.drop_all() if os.environ.get("KB_GYM_DROP_CAPS", "1") != "0" else {"capabilities": "kept"}
    sandbox = {**_confine(scratch, device), **caps}
    sandbox.update(private_shm_mb=SHM_MB if shm else 0, sysv_shm_mb=SHM_MB if sysv else 0, pid_namespace=namespaces,
                   network_namespace=namespaces)
    phase("sandbox")

    def send(message: dict[str, Any]) -> None:
        write_message(proto_out, message)

    payload = PayloadWriter.from_env(device)

    device_buffer: device_payload.DeviceBuffer | None = None  # the judge's, once CUDA is up (device_payload.py)

    def send_tensors(message: dict[str, Any], tensors: list[Any]) -> None:
        # The description first: the judge's clock stops on it, before the bytes are copied out.
        total = sum(m["nbytes"] for m in message["outputs"])
        if device_buffer is not None and SHM_MIN_BYTES <= total <= device_buffer.size and all(
                isinstance(t, torch.Tensor) and (t.device == device_buffer.device or not t.numel())
                for t in tensors):
            send({**message, "payload_bytes": total, "payload_via": "device"})
            try:
                device_buffer.write(tensors, total)
            except (RuntimeError, ValueError):  # an output on the host, a device error: the same bytes, the pipe
                send({"type": "payload", "bytes": total, "via": "pipe"})
                write_tensors(tensors)
                return
            send({"type": "payload", "bytes": total, "via": "device"})
            return
        if payload is not None and total >= SHM_MIN_BYTES:
            send({**message, "payload_bytes": total, "payload_via": "shm"})
            try:
                payload.write(tensors, total)
            except (OSError, RuntimeError, ValueError, BufferError):  # seals the candidate set, a closed fd, no memory
                send({"type": "payload", "bytes": total, "via": "pipe"})  # the same bytes, checked the same way
                write_tensors(tensors)
                return
            send({"type": "payload", "bytes": total})
            return
        send({**message, "payload_bytes": total})
        write_tensors(tensors)

    def write_tensors(tensors: list[Any]) -> None:
        for t in tensors:
            view = host_bytes(t).cast("B")
            while len(view):
                view = view[os.write(proto_out, view):]

    if device.startswith("cuda"):
        try:
            torch.cuda.set_device(torch.device(device))
            torch.zeros(1, device=device).add_(1).item()
        except RuntimeError as exc:
            if not sandbox.get("landlock"):
                raise
            send({"type": LANDLOCK_BREAKS_CUDA, "error": str(exc)[:500]})
            os._exit(3)
    phase("cuda")
    device_buffer = device_payload.from_env(device)
    if device_buffer is not None:
        phase("device_payload")
    pch_dir = os.environ.get(pch.ENV_DIR)
    confined = bool(sandbox.get("landlock"))  # writes only in its scratch folder: the PCH stays as built
    runner = Runner(device, scratch, send, send_tensors, Path(pch_dir) if pch_dir and confined else None,
                    payload.premap if payload is not None else None)
    if os.environ.get("KB_GYM_SECCOMP", "1") != "0":
        sandbox.update(deny_escape_syscalls())
    phase("seccomp")
    # The memfd's pages allocated (and page-locked) now, for outputs of the size the judge expects, not in the
    # first call's copy (payload.PREMAP_MIN_BYTES)
    if payload is not None and payload.premap():
        phase("payload")
    # The digest kernel loaded now (from the Triton cache the judge seeded), not in the first call.
    wanted = os.environ.get(device_digest.ENV_WARM) == "1" and device_digest.applies_to(torch.device(device))
    digest_error = device_digest.warm(torch.device(device)) if wanted else None
    phase("digest")
    send({"type": "ready", "pid": os.getpid(), "sandbox": sandbox, "startup_seconds": time.perf_counter() - started,
          "startup_phases": phases, "ready_at": time.time(),
          "device_digest": wanted and digest_error is None, "device_digest_error": digest_error})
    reader = MessageReader(proto_in)
    while True:
        try:
            msg = reader.read(None)
        except ProtocolError:
            break
        if msg is None or msg.get("type") == "shutdown":
            break
        runner.handle(msg)
    os._exit(0)


if __name__ == "__main__":
    main()
