import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The projections stay cuBLAS matmuls (torch). Eager then builds decay and drive as (batch, L, D, N)
# tensors and runs the scan as a Python loop of L steps, four or five kernels each (about a thousand
# launches at the GPU size). Here one CUDA kernel runs the whole scan: a group of G lanes (G the power of
# two >= d_state, within one warp) owns one (batch, channel) pair and lane n its state h[n] in a register;
# each step reads delta (softplus applied here), u, B and C, updates h, reduces h * C over the group with
# shuffles and writes y_t = (sum + u * skip) * silu(z), the input of out_proj. decay, drive and the
# per-step tensors never reach memory. The update is h = decay * h + drive rounded as the reference rounds
# it (separate product and sum, no fused multiply-add), so only the sum over the states' order differs.
# The kernels (cuda_sources) include no torch header, so nvcc builds them in seconds; the torch glue
# is C++ (cpp_sources).
_CUDA = r"""
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;
constexpr unsigned FULL = 0xffffffffu;

struct Step {
    float u, dt, b, c;
};

template <int G>
__global__ void __launch_bounds__(THREADS) selective_scan_kernel(
        const float* __restrict__ xz,     // (batch, L, 2D): u = [..., :D], z = [..., D:]
        const float* __restrict__ dt,     // (batch, L, D): dt_proj(u), before softplus
        const float* __restrict__ bc,     // (batch, L, 2N): B = [..., :N], C = [..., N:]
        const float* __restrict__ a_log,  // (D, N)
        const float* __restrict__ skip,   // (D,)
        float* __restrict__ y,            // (batch, L, D): (y_scan + u * skip) * silu(z)
        int64_t batch, int64_t length, int64_t dim, int64_t n_state) {
    const int64_t group = (blockIdx.x * (int64_t)THREADS + threadIdx.x) / G;
    const int n = threadIdx.x % G;
    // Every lane of a warp takes part in the shuffles: a group past the end runs on pair 0, unstored.
    const bool stores = group < batch * dim;
    const int64_t pair = stores ? group : 0;
    const int64_t b = pair / dim;
    const int64_t d = pair % dim;
    const bool has_state = n < n_state;
    const float a = has_state ? -expf(a_log[d * n_state + n]) : 0.0f;
    const float sk = skip[d];
    const int64_t row0 = b * length;

    auto load = [&](int64_t t) {
        const int64_t row = row0 + t;
        Step s;
        s.u = xz[row * 2 * dim + d];
        s.dt = dt[row * dim + d];
        s.b = has_state ? bc[row * 2 * n_state + n] : 0.0f;
        s.c = has_state ? bc[row * 2 * n_state + n_state + n] : 0.0f;
        return s;
    };

    float h = 0.0f;
    Step next = load(0);
    for (int64_t t = 0; t < length; ++t) {
        const Step cur = next;
        if (t + 1 < length) next = load(t + 1);  // the next step's loads overlap this step's arithmetic
        const float delta = cur.dt > 20.0f ? cur.dt : log1pf(expf(cur.dt));  // F.softplus, threshold 20
        float part = 0.0f;
        if (has_state) {
            const float decay = expf(delta * a);
            const float drive = __fmul_rn(__fmul_rn(delta, cur.u), cur.b);
            h = __fadd_rn(__fmul_rn(decay, h), drive);
            part = __fmul_rn(h, cur.c);
        }
#pragma unroll
        for (int off = G / 2; off > 0; off >>= 1) part += __shfl_xor_sync(FULL, part, off);
        if (n == 0 && stores) {
            const int64_t row = row0 + t;
            const float z = xz[row * 2 * dim + dim + d];
            const float out = __fadd_rn(part, __fmul_rn(cur.u, sk));
            y[row * dim + d] = __fmul_rn(out, z / (1.0f + expf(-z)));
        }
    }
}

template <int G>
void launch(const float* xz, const float* dt, const float* bc, const float* a_log, const float* skip, float* y,
            int64_t batch, int64_t length, int64_t dim, int64_t n_state, cudaStream_t stream) {
    const int64_t blocks = (batch * dim * G + THREADS - 1) / THREADS;  // <= 2^31 - 1: checked by the caller
    selective_scan_kernel<G><<<(unsigned)blocks, THREADS, 0, stream>>>(xz, dt, bc, a_log, skip, y, batch, length,
                                                                       dim, n_state);
}

}  // namespace

// Contiguous tensors as described at the kernel; batch, length, dim >= 1, 1 <= n_state <= 32.
void launch_selective_scan(const float* xz, const float* dt, const float* bc, const float* a_log, const float* skip,
                           float* y, int64_t batch, int64_t length, int64_t dim, int64_t n_state,
                           cudaStream_t stream) {
    if (n_state <= 4) {
        launch<4>(xz, dt, bc, a_log, skip, y, batch, length, dim, n_state, stream);
    } else if (n_state <= 8) {
        launch<8>(xz, dt, bc, a_log, skip, y, batch, length, dim, n_state, stream);
    } else if (n_state <= 16) {
        launch<16>(xz, dt, bc, a_log, skip, y, batch, length, dim, n_state, stream);
    } else {
        launch<32>(xz, dt, bc, a_log, skip, y, batch, length, dim, n_state, stream);
    }
}
"""

# The torch side (compiled by the host compiler, after load_inline's own #include <torch/extension.h>).
_CPP = r"""
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

void launch_selective_scan(const float* xz, const float* dt, const float* bc, const float* a_log, const float* skip,
                           float* y, int64_t batch, int64_t length, int64_t dim, int64_t n_state,
                           cudaStream_t stream);

torch::Tensor selective_scan(torch::Tensor xz, torch::Tensor dt, torch::Tensor bc, torch::Tensor a_log,
                             torch::Tensor skip) {
    for (const auto* t : {&xz, &dt, &bc, &a_log, &skip}) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == torch::kFloat, "selective_scan: float32 CUDA tensors expected");
    }
    TORCH_CHECK(xz.dim() == 3 && dt.dim() == 3 && bc.dim() == 3 && a_log.dim() == 2 && skip.dim() == 1,
                "selective_scan: xz, dt, bc (batch, L, .), a_log (D, N), skip (D,) expected");
    const int64_t batch = xz.size(0), length = xz.size(1), dim = a_log.size(0), n_state = a_log.size(1);
    TORCH_CHECK(xz.size(2) == 2 * dim && dt.size(0) == batch && dt.size(1) == length && dt.size(2) == dim
                && bc.size(0) == batch && bc.size(1) == length && bc.size(2) == 2 * n_state && skip.size(0) == dim,
                "selective_scan: inconsistent shapes");
    TORCH_CHECK(n_state >= 1 && n_state <= 32, "selective_scan: d_state from 1 to 32 supported");
    TORCH_CHECK(batch * dim <= (int64_t(1) << 26), "selective_scan: too many (batch, channel) pairs");
    const c10::cuda::OptionalCUDAGuard guard(xz.device());
    auto xzc = xz.contiguous();
    auto dtc = dt.contiguous();
    auto bcc = bc.contiguous();
    auto ac = a_log.contiguous();
    auto sc = skip.contiguous();
    auto y = torch::empty({batch, length, dim}, xz.options());
    if (y.numel() == 0) return y;
    launch_selective_scan(xzc.data_ptr<float>(), dtc.data_ptr<float>(), bcc.data_ptr<float>(), ac.data_ptr<float>(),
                          sc.data_ptr<float>(), y.data_ptr<float>(), batch, length, dim, n_state,
                          c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="kb_l3_12_selective_scan", cpp_sources=_CPP, cuda_sources=_CUDA,
                   functions=["selective_scan"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    """Mamba-style layer: torch's linear projections around one CUDA kernel that runs the whole selective
    scan (softplus, decay, drive, the L-step recurrence, the C readout, skip and SiLU gate) in registers."""

    def __init__(self, d_model, d_inner, d_state):
        super().__init__()
        self.in_proj = nn.Linear(d_model, 2 * d_inner)
        self.dt_proj = nn.Linear(d_inner, d_inner)
        self.bc_proj = nn.Linear(d_inner, 2 * d_state, bias=False)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.skip = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model)

    def forward(self, x):
        xz = self.in_proj(x)
        u = xz.chunk(2, dim=-1)[0]  # the same view the reference projects
        y = _ext.selective_scan(xz, self.dt_proj(u), self.bc_proj(u), self.a_log, self.skip)
        return self.out_proj(y)
