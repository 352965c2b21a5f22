"""How a runner names a candidate's failure for the verdict, the audit and the policy's feedback."""

from __future__ import annotations

import torch

from kb_gym.worker.loading import out_of_device_memory

# What torch 2.11's caching allocator raised for every out-of-memory in a runner on the H200 (session 19): composing
# its OOM message it starts NVML, which fails in the sandbox.
MASKED_OOM = ('NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
              '"/pytorch/c10/cuda/CUDACachingAllocator.cpp":1135, please report a bug to PyTorch.')


def test_the_allocators_masked_oom_counts_as_out_of_memory():
    assert out_of_device_memory(RuntimeError(MASKED_OOM))
    assert out_of_device_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB"))
    # cuBLAS's workspace, as a judge's own matmul words it when the device is full
    assert out_of_device_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))


def test_other_errors_are_not_out_of_memory():
    assert not out_of_device_memory(RuntimeError("shape mismatch: [4, 4] and [3]"))
    # NVML failing elsewhere (a peer-access check) is not an allocation that failed
    assert not out_of_device_memory(RuntimeError(MASKED_OOM.replace("CUDACachingAllocator", "PeerToPeerAccess")))
    assert not out_of_device_memory(ValueError(MASKED_OOM))


def _asking_runner(monkeypatch, failures: list[BaseException]):
    """A runner's ``_inputs`` alone, on a CUDA device as far as it can tell, whose remaking of the inputs raises
    ``failures`` first; what it replies is collected."""
    import types

    from kb_gym.worker import runner

    made = []

    def make_inputs(ref_mod, seed, device, dtype, widen=False):
        if failures:
            raise failures.pop(0)
        made.append(seed)
        return [torch.ones(4)]

    monkeypatch.setattr(runner, "make_inputs", make_inputs)
    freed = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(True))
    replies = []
    r = object.__new__(runner.Runner)
    r.device, r.ref_mod, r.dtype = types.SimpleNamespace(type="cuda"), None, torch.float32
    r.send = replies.append
    r.last_inputs, r.last_outputs, r.collect_after = (7, False, [torch.ones(4)]), [torch.zeros(4)], False
    return r, replies, freed


def test_the_timed_inputs_made_again_out_of_memory_are_tried_once_more_with_the_cache_given_back(monkeypatch):
    """The call's outputs stay held until the reply (round 36), so the inputs made again can miss the device's memory:
    once more after ``empty_cache``, not a write to the inputs for want of memory."""
    r, replies, freed = _asking_runner(monkeypatch, [torch.OutOfMemoryError("CUDA out of memory")])
    r._inputs()
    assert replies == [{"type": "inputs", "mutated": False}] and freed == [True]
    assert r.last_outputs is None and r.last_inputs is None  # let go once answered

    r, replies, freed = _asking_runner(monkeypatch, [torch.OutOfMemoryError("CUDA out of memory")] * 2)
    r._inputs()
    assert replies == [{"type": "inputs", "mutated": True}] and freed == [True]  # twice: counted as changed

    r, replies, freed = _asking_runner(monkeypatch, [TypeError("an input swapped for a list")])
    r._inputs()
    assert replies == [{"type": "inputs", "mutated": True}] and freed == []


def test_a_call_whose_inputs_do_not_fit_is_answered_out_of_memory_not_a_dead_runner(monkeypatch):
    """Beside a neighbour's 6.4 GB job on an H100, a reference copy's runner died copying its trial inputs (the
    pristine copy for the mutation check), and the job was a `crash`. Now the runner replies with the allocator's
    error, named as out of memory, which the judge turns into a run alone (job.run_job's device_oom)."""
    import types

    from kb_gym.worker import runner
    from kb_gym.worker.loading import OUT_OF_DEVICE_MEMORY

    for where in ("make_inputs", "clone_inputs"):
        def fail(*args, where=where, **kwargs):
            raise torch.OutOfMemoryError(f"CUDA out of memory in {where}. Tried to allocate 6.00 GiB")

        monkeypatch.setattr(runner, "make_inputs", fail if where == "make_inputs" else lambda *a, **k: [torch.ones(4)])
        monkeypatch.setattr(runner, "clone_inputs", fail if where == "clone_inputs" else lambda inputs: list(inputs))
        monkeypatch.setattr(runner, "sticky_cuda_error", lambda device: False)
        replies = []
        r = object.__new__(runner.Runner)
        r.device, r.ref_mod, r.dtype = types.SimpleNamespace(type="cuda"), None, torch.float32
        r.ref_model, r.model, r.forward_checked, r.candidate_file = torch.nn.Identity(), None, True, "new.py"
        r.send = replies.append
        r._call({"type": "call", "seed": 3, "target": "reference", "check_mutation": True}, timed=False)
        assert len(replies) == 1 and replies[0]["type"] == "error", replies
        assert replies[0]["status"] == "runtime_error" and replies[0]["error"].startswith(OUT_OF_DEVICE_MEMORY)
        assert where in replies[0]["error"]
