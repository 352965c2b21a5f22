import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Eager: x.pow(2), the row mean, rsqrt, two products, silu(gate) and the last product: eight kernels, most
# of them a full (T, D) read and write. Here a block per row reads x (kept in registers), reduces its sum
# of squares with warp shuffles, then reads the gate and writes the output: three passes instead of about
# fifteen. The arithmetic follows the reference: ((x * rsqrt(mean + eps)) * weight) * (g / (1 + exp(-g))).
# The kernels (cuda_sources) include no torch header, so nvcc builds them in seconds; the glue is C++.
_CUDA = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;
constexpr int CACHED = 4;  // float4s of x each thread keeps in registers (rows up to 4096 wide); more are re-read
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float gated(float x, float r, float w, float g) { return x * r * w * silu(g); }

// Sum of v over the block; every thread gets it. `shared` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL, v, off);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? shared[lane] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL, v, off);
    __syncthreads();  // shared may be written again by the next row
    return v;
}

__global__ void __launch_bounds__(THREADS) rms_gate_vec4(const float* __restrict__ x, const float* __restrict__ gate,
                                                         const float* __restrict__ weight, float* __restrict__ out,
                                                         int64_t n_rows, int64_t dim, float inv_dim, float eps) {
    __shared__ float shared[THREADS / 32];
    const int64_t n4 = dim >> 2;
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const float4* x4 = reinterpret_cast<const float4*>(x + row * dim);
        const float4* g4 = reinterpret_cast<const float4*>(gate + row * dim);
        float4* o4 = reinterpret_cast<float4*>(out + row * dim);
        float4 xv[CACHED];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < CACHED; ++k) {
            const int64_t i = threadIdx.x + (int64_t)k * THREADS;
            xv[k] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
        }
        for (int64_t i = threadIdx.x + (int64_t)CACHED * THREADS; i < n4; i += THREADS) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        const float r = rsqrtf(block_sum(ss, shared) * inv_dim + eps);
#pragma unroll
        for (int k = 0; k < CACHED; ++k) {
            const int64_t i = threadIdx.x + (int64_t)k * THREADS;
            if (i < n4) {
                const float4 g = g4[i];
                const float4 w = w4[i];
                o4[i] = make_float4(gated(xv[k].x, r, w.x, g.x), gated(xv[k].y, r, w.y, g.y),
                                    gated(xv[k].z, r, w.z, g.z), gated(xv[k].w, r, w.w, g.w));
            }
        }
        for (int64_t i = threadIdx.x + (int64_t)CACHED * THREADS; i < n4; i += THREADS) {
            const float4 v = x4[i];
            const float4 g = g4[i];
            const float4 w = w4[i];
            o4[i] = make_float4(gated(v.x, r, w.x, g.x), gated(v.y, r, w.y, g.y),
                                gated(v.z, r, w.z, g.z), gated(v.w, r, w.w, g.w));
        }
    }
}

__global__ void __launch_bounds__(THREADS) rms_gate_scalar(const float* __restrict__ x, const float* __restrict__ gate,
                                                           const float* __restrict__ weight, float* __restrict__ out,
                                                           int64_t n_rows, int64_t dim, float inv_dim, float eps) {
    __shared__ float shared[THREADS / 32];
    for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const float* xr = x + row * dim;
        const float* gr = gate + row * dim;
        float* orow = out + row * dim;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < dim; i += THREADS) ss += xr[i] * xr[i];
        const float r = rsqrtf(block_sum(ss, shared) * inv_dim + eps);
        for (int64_t i = threadIdx.x; i < dim; i += THREADS) orow[i] = gated(xr[i], r, weight[i], gr[i]);
    }
}

bool aligned16(const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// Contiguous (n_rows, dim) x, gate and out, weight (dim,); n_rows, dim >= 1.
void launch_rms_norm_silu_gate(const float* x, const float* gate, const float* weight, float* out, int64_t n_rows,
                               int64_t dim, float eps, cudaStream_t stream) {
    const unsigned blocks = (unsigned)(n_rows < (1 << 30) ? n_rows : (1 << 30));
    const float inv_dim = 1.0f / static_cast<float>(dim);
    if (dim % 4 == 0 && aligned16(x) && aligned16(gate) && aligned16(weight) && aligned16(out)) {
        rms_gate_vec4<<<blocks, THREADS, 0, stream>>>(x, gate, weight, out, n_rows, dim, inv_dim, eps);
    } else {
        rms_gate_scalar<<<blocks, THREADS, 0, stream>>>(x, gate, weight, out, n_rows, dim, inv_dim, eps);
    }
}
"""

# The torch side (compiled by the host compiler, after load_inline's own #include <torch/extension.h>).
_CPP = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

void launch_rms_norm_silu_gate(const float* x, const float* gate, const float* weight, float* out, int64_t n_rows,
                               int64_t dim, float eps, cudaStream_t stream);

torch::Tensor rms_norm_silu_gate(torch::Tensor x, torch::Tensor gate, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && gate.is_cuda() && weight.is_cuda(), "rms_norm_silu_gate: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && gate.scalar_type() == torch::kFloat
                && weight.scalar_type() == torch::kFloat, "rms_norm_silu_gate: float32 tensors expected");
    TORCH_CHECK(x.dim() >= 1 && x.sizes() == gate.sizes() && weight.dim() == 1 && weight.size(0) == x.size(-1),
                "rms_norm_silu_gate: x and gate (..., D) and weight (D,) expected");
    const c10::cuda::OptionalCUDAGuard guard(x.device());
    auto xc = x.contiguous();
    auto gc = gate.contiguous();
    auto wc = weight.contiguous();
    auto out = torch::empty_like(xc);
    if (xc.numel() == 0) return out;
    const int64_t dim = xc.size(-1);
    launch_rms_norm_silu_gate(xc.data_ptr<float>(), gc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(),
                              xc.numel() / dim, dim, static_cast<float>(eps), c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="kb_l2_42_rms_norm_silu_gate", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["rms_norm_silu_gate"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    """RMSNorm with a gain times SiLU of the gate, one CUDA kernel: a block per row, x held in registers
    between the sum of squares and the output."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x, gate):
        return _ext.rms_norm_silu_gate(x, gate, self.weight, float(self.eps))
