"""Findings and the flags they carry: which flags exist, what each one means, and why it costs what it costs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One integrity finding: ``flag`` (a policy key), ``message`` (one sentence naming the line), ``line``."""

    flag: str
    message: str
    line: int | None

    def to_dict(self) -> dict:
        return {"flag": self.flag, "message": self.message, "line": self.line}


STATIC_FLAGS = frozenset({
    "harness_patch", "timer_patch", "introspection", "concurrency", "io_escape", "tensor_subclass",
    "fallback", "decoy", "unused_kernel", "replay", "precision_change", "dynamic_code", "unchecked",
    "pytorch_compiler", "star_import", "unlisted_import",
})
RUNTIME_FLAGS = frozenset({
    "no_custom_kernel", "input_mutation", "side_stream", "tampering", "timing_mismatch",
    "degenerate_problem", "unverifiable_output", "excessive_speedup", "nondeterministic", "ill_conditioned",
    "launch_bound", "token_kernel", "unverified_timing",
})
ALWAYS_FAIL = frozenset({"tampering", "timing_mismatch"})

FLAG_DESCRIPTIONS: dict[str, str] = {
    "harness_patch": "patches torch, Triton, NumPy, Python modules or the evaluator",
    "timer_patch": "patches clocks, CUDA events, synchronize or benchmark helpers",
    "introspection": "reads interpreter frames, the garbage collector, raw memory, object internals or "
                     "evaluator objects",
    "concurrency": "uses threads, processes, subprocesses or async tasks",
    "io_escape": "uses the network, signals, process control, the environment or absolute-path writes",
    "tensor_subclass": "subclasses torch.Tensor or hooks torch's dispatch",
    "fallback": "falls back to PyTorch when the kernel fails or is unavailable",
    "decoy": "defines kernels that ModelNew.forward never launches",
    "unused_kernel": "defines kernels that ModelNew.forward never launches, next to ones it does",
    "replay": "returns results cached from an earlier call",
    "precision_change": "changes global numerics or compiler settings shared with the reference",
    "dynamic_code": "builds code or attribute names at run time (exec, eval, compile, computed getattr) where "
                    "the checks cannot see it",
    "pytorch_compiler": "has PyTorch's compiler (torch.compile, Inductor, TorchScript, torch.export) write "
                        "the kernels",
    "star_import": "imports every name of a module with `*`, hiding which names the code uses",
    "unlisted_import": "imports a module outside the allowlist of kernel modules",
    "unchecked": "too large for the static checks; only a line scan ran",
    "no_custom_kernel": "no kernel of the candidate's own ran in forward",
    "token_kernel": "its own kernels ran, but PyTorch computed the answer: right with them doing nothing, or "
                    "computed by PyTorch alone and only moved or fed constants by them",
    "input_mutation": "forward wrote to its inputs",
    "side_stream": "work ran on another stream after forward returned",
    "launch_bound": "back to back, forward cost its host (launch) time, more than its GPU time; it was charged that",
    "unverified_timing": "the judge's own clock could not confirm the time the timed calls reported (the probe "
                         "check could not run its calls to the end)",
    "tampering": "the harness's functions were replaced while running",
    "timing_mismatch": "outputs produced while timing differed from the reference",
    "degenerate_problem": "a trivial output (zeros, the input, another input's answer) passes the tolerance; "
                          "correctness also used relative error",
    "unverifiable_output": "a trivial output equals the answer to within rounding: no check can tell a "
                           "kernel from a shortcut on this problem",
    "excessive_speedup": "the speedup is beyond what the hardware allows",
    "ill_conditioned": "the fp32 reference itself is off from a float64 computation beyond the tolerance; "
                       "the candidate was held to the reference's own accuracy against float64",
    "nondeterministic": "repeated runs on the same inputs gave different outputs",
}

# The reason a static finding's message gives after its "what" (flags not listed here give theirs in place).
WHY: dict[str, str] = {
    "harness_patch": "patching torch, Triton, NumPy, Python's modules or the evaluator changes how kernels "
                     "are checked and timed, so it is not allowed",
    "timer_patch": "replacing clocks, CUDA events, synchronize or benchmark helpers falsifies the timing, "
                   "so it is not allowed",
    "precision_change": "global numerics and compiler settings also change the reference and the baseline, "
                        "so the result gets no speed credit",
    "introspection": "reading interpreter frames, the garbage collector, raw memory or the evaluator's "
                     "objects can reach the expected outputs, so it is not allowed",
    "concurrency": "threads, processes, subprocesses and async tasks can run work outside the timed region, "
                   "so they are not allowed (CUDA streams are fine)",
    "io_escape": "the network, signals, process control, environment changes and writes outside the working "
                 "folder are not allowed",
    "tensor_subclass": "tensor subclasses, __torch_function__/__torch_dispatch__ hooks and aten overrides "
                       "change what the evaluator's comparisons see, so they are not allowed",
    "dynamic_code": "code built at run time cannot be checked, so the result gets no speed credit",
    "pytorch_compiler": "kernels that PyTorch's compiler writes are not your own, so the result gets no speed "
                        "credit",
    "star_import": "a star import hides which names the code uses, so it is not allowed; import the module "
                   "(`import triton.language as tl`) or the names you need",
    "unlisted_import": "kernel code may import torch, triton, numpy, cupy, numba, einops, os and a few pure "
                       "standard modules (math, functools, itertools, collections, typing, dataclasses, "
                       "enum, abc, warnings, textwrap); a module outside this allowlist costs the speed credit, "
                       "and one that reaches frames, processes, the file system or the harness is not allowed",
}
