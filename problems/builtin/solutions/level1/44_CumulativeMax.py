import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Eager torch.cummax writes the int64 indices beside the values (12 bytes out per element) with a slow
# scan kernel; only the values are asked for. Here a warp scans a row: each lane takes a float4 of a
# 128-column tile, scans it in registers, the lanes' maxima are scanned with shuffles, and the maximum so
# far carries to the next tile. Read once, write once, exact (a max never rounds). The kernels
# (cuda_sources) include no torch header, so nvcc builds them in seconds; the torch glue is C++.
_CUDA = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;  // 8 warps: 8 rows at a time per block
constexpr int TILES = 4;      // tiles of 32 lanes loaded before scanning (loads in flight per lane)
constexpr unsigned FULL = 0xffffffffu;

// max that keeps a NaN once seen, as torch.cummax does.
__device__ __forceinline__ float cmax(float a, float b) { return (b > a || isnan(b)) ? b : a; }

// Inclusive max-scan of v over the warp's lanes.
__device__ __forceinline__ float warp_scan(float v, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_up_sync(FULL, v, off);
        if (lane >= off) v = cmax(o, v);
    }
    return v;
}

__global__ void __launch_bounds__(THREADS) cummax_vec4(const float* __restrict__ x, float* __restrict__ y,
                                                       int64_t n_rows, int64_t n_cols) {
    const int lane = threadIdx.x & 31;
    const int64_t n4 = n_cols >> 2;
    const int64_t first = (blockIdx.x * (int64_t)THREADS + threadIdx.x) >> 5;
    const int64_t stride = (gridDim.x * (int64_t)THREADS) >> 5;
    for (int64_t row = first; row < n_rows; row += stride) {  // warp-uniform
        const float4* src = reinterpret_cast<const float4*>(x + row * n_cols);
        float4* dst = reinterpret_cast<float4*>(y + row * n_cols);
        float carry = -INFINITY;  // max of the row's columns before the current tile
        for (int64_t base = 0; base < n4; base += 32 * TILES) {
            float4 v[TILES];
#pragma unroll
            for (int k = 0; k < TILES; ++k) {
                const int64_t i = base + k * 32 + lane;
                v[k] = i < n4 ? src[i] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            }
#pragma unroll
            for (int k = 0; k < TILES; ++k) {
                float4 a = v[k];
                a.y = cmax(a.x, a.y);
                a.z = cmax(a.y, a.z);
                a.w = cmax(a.z, a.w);
                const float incl = warp_scan(a.w, lane);
                const float before = __shfl_up_sync(FULL, incl, 1);
                const float prefix = lane == 0 ? carry : cmax(carry, before);
                a.x = cmax(prefix, a.x);
                a.y = cmax(prefix, a.y);
                a.z = cmax(prefix, a.z);
                a.w = cmax(prefix, a.w);
                const int64_t i = base + k * 32 + lane;
                if (i < n4) dst[i] = a;
                carry = __shfl_sync(FULL, cmax(carry, incl), 31);
            }
        }
    }
}

__global__ void __launch_bounds__(THREADS) cummax_scalar(const float* __restrict__ x, float* __restrict__ y,
                                                         int64_t n_rows, int64_t n_cols) {
    const int lane = threadIdx.x & 31;
    const int64_t first = (blockIdx.x * (int64_t)THREADS + threadIdx.x) >> 5;
    const int64_t stride = (gridDim.x * (int64_t)THREADS) >> 5;
    for (int64_t row = first; row < n_rows; row += stride) {
        const float* src = x + row * n_cols;
        float* dst = y + row * n_cols;
        float carry = -INFINITY;
        for (int64_t base = 0; base < n_cols; base += 32) {
            const int64_t i = base + lane;
            const float incl = warp_scan(i < n_cols ? src[i] : -INFINITY, lane);
            const float out = cmax(carry, incl);
            if (i < n_cols) dst[i] = out;
            carry = __shfl_sync(FULL, out, 31);
        }
    }
}

}  // namespace

// Contiguous (n_rows, n_cols) in and out, both >= 1.
void launch_cummax_rows(const float* x, float* y, int64_t n_rows, int64_t n_cols, cudaStream_t stream) {
    const int64_t rows_per_block = THREADS / 32;
    int64_t blocks = (n_rows + rows_per_block - 1) / rows_per_block;
    if (blocks > (1 << 30)) blocks = 1 << 30;
    const bool vec = n_cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0
                     && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    if (vec) {
        cummax_vec4<<<(unsigned)blocks, THREADS, 0, stream>>>(x, y, n_rows, n_cols);
    } else {
        cummax_scalar<<<(unsigned)blocks, THREADS, 0, stream>>>(x, y, n_rows, n_cols);
    }
}
"""

# The torch side (compiled by the host compiler, after load_inline's own #include <torch/extension.h>).
_CPP = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

void launch_cummax_rows(const float* x, float* y, int64_t n_rows, int64_t n_cols, cudaStream_t stream);

torch::Tensor cummax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "cummax_rows: a float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 1, "cummax_rows: at least one dimension expected");
    const c10::cuda::OptionalCUDAGuard guard(x.device());
    auto src = x.contiguous();
    auto out = torch::empty_like(src);
    if (src.numel() == 0) return out;
    const int64_t n_cols = src.size(-1);
    launch_cummax_rows(src.data_ptr<float>(), out.data_ptr<float>(), src.numel() / n_cols, n_cols,
                       c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="kb_l1_44_cummax_rows", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["cummax_rows"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    """Running maximum along the last axis: a warp per row, float4 tiles scanned in registers and across
    the lanes by shuffles, values only (no index tensor)."""

    def __init__(self):
        super().__init__()

    def forward(self, vals):
        return _ext.cummax_rows(vals)
