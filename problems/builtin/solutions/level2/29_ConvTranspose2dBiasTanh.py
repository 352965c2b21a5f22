import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

# The transposed convolution stays cuDNN's, run without its bias. Eager then adds the layer's bias, the
# channel bias, takes tanh and scales: four elementwise passes over the (N, C_out, 2H, 2W) output, each a
# full read and write. Here one CUDA kernel does all four in place: tanh((y + bias[c]) + channel_bias[c])
# * scale, in the reference's order. A block row of the grid covers one (n, c) plane, so each block reads
# its two bias values once; float4 loads and stores where a plane's size allows. The kernels
# (cuda_sources) include no torch header, so nvcc builds them in seconds; the torch glue is C++.
_CUDA = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ float epilogue(float v, float b1, float b2, float scale) {
    return tanhf((v + b1) + b2) * scale;
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS) bias_tanh_scale_kernel(float* __restrict__ y,
                                                                  const float* __restrict__ conv_bias,
                                                                  const float* __restrict__ channel_bias,
                                                                  int64_t planes, int64_t channels, int64_t plane_size,
                                                                  float scale) {
    for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
        const int64_t c = p % channels;
        const float b1 = conv_bias[c];
        const float b2 = channel_bias[c];
        float* plane = y + p * plane_size;
        if (VEC) {  // plane_size % 4 == 0 and y 16-byte aligned (checked by the host)
            float4* p4 = reinterpret_cast<float4*>(plane);
            const int64_t n4 = plane_size >> 2;
            for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < n4; i += (int64_t)gridDim.x * THREADS) {
                float4 v = p4[i];
                v.x = epilogue(v.x, b1, b2, scale);
                v.y = epilogue(v.y, b1, b2, scale);
                v.z = epilogue(v.z, b1, b2, scale);
                v.w = epilogue(v.w, b1, b2, scale);
                p4[i] = v;
            }
        } else {
            for (int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x; i < plane_size;
                 i += (int64_t)gridDim.x * THREADS) {
                plane[i] = epilogue(plane[i], b1, b2, scale);
            }
        }
    }
}

}  // namespace

// y: planes = N * C contiguous planes of plane_size floats (both >= 1), overwritten; one bias pair per channel.
void launch_bias_tanh_scale(float* y, const float* conv_bias, const float* channel_bias, int64_t planes,
                            int64_t channels, int64_t plane_size, float scale, cudaStream_t stream) {
    const bool vec = plane_size % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    const int64_t per_plane = vec ? plane_size / 4 : plane_size;
    // About four elements (or float4s) per thread within a plane; planes beyond 65535 loop over grid.y.
    int64_t bx = (per_plane + 4 * THREADS - 1) / (4 * THREADS);
    if (bx > (1 << 16)) bx = 1 << 16;
    const dim3 grid((unsigned)bx, (unsigned)(planes < 65535 ? planes : 65535));
    if (vec) {
        bias_tanh_scale_kernel<true><<<grid, THREADS, 0, stream>>>(y, conv_bias, channel_bias, planes, channels,
                                                                   plane_size, scale);
    } else {
        bias_tanh_scale_kernel<false><<<grid, THREADS, 0, stream>>>(y, conv_bias, channel_bias, planes, channels,
                                                                    plane_size, scale);
    }
}
"""

# The torch side (compiled by the host compiler, after load_inline's own #include <torch/extension.h>).
_CPP = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

void launch_bias_tanh_scale(float* y, const float* conv_bias, const float* channel_bias, int64_t planes,
                            int64_t channels, int64_t plane_size, float scale, cudaStream_t stream);

// y: the (N, C, H, W) convolution output without bias, overwritten with the result (and returned).
torch::Tensor bias_tanh_scale_(torch::Tensor y, torch::Tensor conv_bias, torch::Tensor channel_bias, double scale) {
    TORCH_CHECK(y.is_cuda() && conv_bias.is_cuda() && channel_bias.is_cuda(),
                "bias_tanh_scale_: CUDA tensors expected");
    TORCH_CHECK(y.scalar_type() == torch::kFloat && conv_bias.scalar_type() == torch::kFloat
                && channel_bias.scalar_type() == torch::kFloat, "bias_tanh_scale_: float32 tensors expected");
    TORCH_CHECK(y.dim() == 4 && y.is_contiguous(), "bias_tanh_scale_: a contiguous NCHW tensor expected");
    const int64_t channels = y.size(1);
    TORCH_CHECK(conv_bias.numel() == channels && channel_bias.numel() == channels,
                "bias_tanh_scale_: one bias value per channel expected");
    const c10::cuda::OptionalCUDAGuard guard(y.device());
    auto b1 = conv_bias.contiguous();
    auto b2 = channel_bias.contiguous();
    const int64_t planes = y.size(0) * channels;
    const int64_t plane_size = y.size(2) * y.size(3);
    if (planes == 0 || plane_size == 0) return y;
    launch_bias_tanh_scale(y.data_ptr<float>(), b1.data_ptr<float>(), b2.data_ptr<float>(), planes, channels,
                           plane_size, static_cast<float>(scale), c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l2_29_bias_tanh_scale", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["bias_tanh_scale_"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    """cuDNN transposed convolution without its bias; both biases, tanh and the scale in one in-place
    CUDA pass over its output."""

    def __init__(self, c_in, c_out, scale):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(c_in, c_out, 3, stride=2, padding=1, output_padding=1)
        self.channel_bias = nn.Parameter(0.5 * torch.randn(c_out, 1, 1))
        self.scale = scale

    def forward(self, img):
        d = self.deconv
        y = F.conv_transpose2d(img, d.weight, None, stride=d.stride, padding=d.padding,
                               output_padding=d.output_padding, groups=d.groups, dilation=d.dilation)
        return _ext.bias_tanh_scale_(y.contiguous(), d.bias, self.channel_bias, float(self.scale))
