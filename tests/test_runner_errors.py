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
