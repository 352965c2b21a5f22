# y = x * a + b in one CUDA pass (float4 loads), built with load_inline.
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void axpb_kernel(const float4* __restrict__ x, float4* __restrict__ y, long n4, float a, float b) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = v.x * a + b; v.y = v.y * a + b; v.z = v.z * a + b; v.w = v.w * a + b;
        y[i] = v;
    }
}

torch::Tensor axpb(torch::Tensor x, double a, double b) {
    auto y = torch::empty_like(x);
    long n4 = x.numel() / 4;
    axpb_kernel<<<(n4 + 255) / 256, 256>>>((const float4*)x.data_ptr<float>(), (float4*)y.data_ptr<float>(),
                                           n4, (float)a, (float)b);
    return y;
}
"""
_ext = load_inline(name="fidelity_axpb", cpp_sources="torch::Tensor axpb(torch::Tensor x, double a, double b);",
                   cuda_sources=_cuda, functions=["axpb"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return _ext.axpb(x.contiguous(), self.a, self.b)
