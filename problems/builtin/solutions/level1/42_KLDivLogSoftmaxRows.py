import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Eager: two log_softmax kernels (each reads a matrix and writes one), kl_div (reads two, writes one),
# then the row sum (reads one): about eight passes over a (rows, classes) matrix. Here: one read of each
# input and one float per row out.
#
# Per row, with M = max and S = sum(exp(x - M)) of each input (t: teacher, s: student):
#   log p_j - log q_j = (t_j - s_j) - (M_t + log S_t) + (M_s + log S_s), and sum_j p_j = 1, so
#   kl = W / S_t + (M_s + log S_s) - (M_t + log S_t),  W = sum_j exp(t_j - M_t) * (t_j - s_j).
# M, S and W are kept online (rescaled when the running maximum rises) by each thread over its
# columns, then merged across the block. The kernels (cuda_sources) include no torch header, so nvcc
# builds them in seconds; the torch glue is C++ (cpp_sources).
_CUDA = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;
constexpr unsigned FULL = 0xffffffffu;

struct RowState {
    float mt, st, w;  // teacher: running max, sum of exp(t - mt), sum of exp(t - mt) * (t - s)
    float ms, ss;     // student: running max, sum of exp(s - ms)
};

__device__ __forceinline__ void add_pair(RowState& a, float s, float t) {
    const float d = t - s;
    if (t > a.mt) {  // a new maximum (the first column too: exp(-inf) = 0 clears the empty sums)
        const float r = expf(a.mt - t);
        a.st = a.st * r + 1.0f;
        a.w = a.w * r + d;
        a.mt = t;
    } else {
        const float e = expf(t - a.mt);
        a.st += e;
        a.w += e * d;
    }
    if (s > a.ms) {
        a.ss = a.ss * expf(a.ms - s) + 1.0f;
        a.ms = s;
    } else {
        a.ss += expf(s - a.ms);
    }
}

// Merge another partial state into a; a side that saw no column has max -inf and empty sums.
__device__ __forceinline__ void merge(RowState& a, const RowState& b) {
    if (b.mt > a.mt) {
        const float r = expf(a.mt - b.mt);
        a.st = a.st * r + b.st;
        a.w = a.w * r + b.w;
        a.mt = b.mt;
    } else if (b.mt != -INFINITY) {
        const float r = expf(b.mt - a.mt);
        a.st += b.st * r;
        a.w += b.w * r;
    }
    if (b.ms > a.ms) {
        a.ss = a.ss * expf(a.ms - b.ms) + b.ss;
        a.ms = b.ms;
    } else if (b.ms != -INFINITY) {
        a.ss += b.ss * expf(b.ms - a.ms);
    }
}

__device__ __forceinline__ RowState shfl_xor(const RowState& a, int off) {
    RowState b;
    b.mt = __shfl_xor_sync(FULL, a.mt, off);
    b.st = __shfl_xor_sync(FULL, a.st, off);
    b.w = __shfl_xor_sync(FULL, a.w, off);
    b.ms = __shfl_xor_sync(FULL, a.ms, off);
    b.ss = __shfl_xor_sync(FULL, a.ss, off);
    return b;
}

__device__ __forceinline__ RowState empty_state() {
    RowState a;
    a.mt = -INFINITY; a.st = 0.0f; a.w = 0.0f;
    a.ms = -INFINITY; a.ss = 0.0f;
    return a;
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS) kl_rows_kernel(const float* __restrict__ student,
                                                          const float* __restrict__ teacher,
                                                          float* __restrict__ out, int64_t n_rows, int64_t n_cols) {
    __shared__ RowState partial[THREADS / 32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int64_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const float* s_row = student + row * n_cols;
        const float* t_row = teacher + row * n_cols;
        RowState a = empty_state();
        if (VEC) {  // n_cols % 4 == 0 and both bases 16-byte aligned
            const float4* s4 = reinterpret_cast<const float4*>(s_row);
            const float4* t4 = reinterpret_cast<const float4*>(t_row);
            const int64_t n4 = n_cols >> 2;
            for (int64_t i = threadIdx.x; i < n4; i += THREADS) {
                const float4 s = s4[i];
                const float4 t = t4[i];
                add_pair(a, s.x, t.x);
                add_pair(a, s.y, t.y);
                add_pair(a, s.z, t.z);
                add_pair(a, s.w, t.w);
            }
        } else {
            for (int64_t i = threadIdx.x; i < n_cols; i += THREADS) add_pair(a, s_row[i], t_row[i]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) merge(a, shfl_xor(a, off));
        if (lane == 0) partial[warp] = a;
        __syncthreads();
        if (warp == 0) {
            a = lane < THREADS / 32 ? partial[lane] : empty_state();
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) merge(a, shfl_xor(a, off));
            if (lane == 0) out[row] = a.w / a.st + (a.ms + logf(a.ss)) - (a.mt + logf(a.st));
        }
        __syncthreads();  // partial is reused by the next row
    }
}

}  // namespace

// Contiguous (n_rows, n_cols) inputs, n_rows >= 1, n_cols >= 1; out has n_rows floats.
void launch_kl_rows(const float* student, const float* teacher, float* out, int64_t n_rows, int64_t n_cols,
                    cudaStream_t stream) {
    const bool vec = n_cols % 4 == 0 && reinterpret_cast<uintptr_t>(student) % 16 == 0
                     && reinterpret_cast<uintptr_t>(teacher) % 16 == 0;
    const unsigned blocks = (unsigned)(n_rows < (1 << 30) ? n_rows : (1 << 30));
    if (vec) {
        kl_rows_kernel<true><<<blocks, THREADS, 0, stream>>>(student, teacher, out, n_rows, n_cols);
    } else {
        kl_rows_kernel<false><<<blocks, THREADS, 0, stream>>>(student, teacher, out, n_rows, n_cols);
    }
}
"""

# The torch side (compiled by the host compiler, after load_inline's own #include <torch/extension.h>).
_CPP = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

void launch_kl_rows(const float* student, const float* teacher, float* out, int64_t n_rows, int64_t n_cols,
                    cudaStream_t stream);

torch::Tensor kl_rows(torch::Tensor student, torch::Tensor teacher) {
    TORCH_CHECK(student.is_cuda() && teacher.is_cuda(), "kl_rows: CUDA tensors expected");
    TORCH_CHECK(student.scalar_type() == torch::kFloat && teacher.scalar_type() == torch::kFloat,
                "kl_rows: float32 tensors expected");
    TORCH_CHECK(student.dim() >= 1 && student.sizes() == teacher.sizes(), "kl_rows: same shapes expected");
    const c10::cuda::OptionalCUDAGuard guard(student.device());
    auto s = student.contiguous();
    auto t = teacher.contiguous();
    const int64_t n_cols = s.size(-1);
    auto out_sizes = s.sizes().vec();
    out_sizes.pop_back();
    auto out = torch::empty(out_sizes, s.options());
    const int64_t n_rows = out.numel();
    if (n_rows == 0) return out;
    if (n_cols == 0) return out.zero_();  // an empty sum
    launch_kl_rows(s.data_ptr<float>(), t.data_ptr<float>(), out.data_ptr<float>(), n_rows, n_cols,
                   c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="kb_l1_42_kl_rows", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["kl_rows"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    """Per-row KL(softmax(teacher) || softmax(student)) in one CUDA pass: a block per row keeps both
    rows' online max and exp-sums and the p-weighted sum of (t - s), then merges them."""

    def __init__(self):
        super().__init__()

    def forward(self, student_logits, teacher_logits):
        return _ext.kl_rows(student_logits, teacher_logits)
