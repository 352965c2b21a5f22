import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mamba-style selective state-space layer: input-dependent (delta, B, C), a sequential scan, SiLU gate.

    u, z = in_proj(x); delta = softplus(dt_proj(u)); B, C = projections of u; A = -exp(A_log) (D, N);
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t;  y_t = <h_t, C_t> + skip * u_t (a Python loop
    over time); out = out_proj(y * silu(z)). x: (batch, L, d_model) -> (batch, L, d_model).
    """

    def __init__(self, d_model, d_inner, d_state):
        super().__init__()
        self.in_proj = nn.Linear(d_model, 2 * d_inner)
        self.dt_proj = nn.Linear(d_inner, d_inner)
        self.bc_proj = nn.Linear(d_inner, 2 * d_state, bias=False)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.skip = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model)

    def forward(self, x):
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (b, L, D) each
        delta = F.softplus(self.dt_proj(u))  # (b, L, D)
        b_t, c_t = self.bc_proj(u).chunk(2, dim=-1)  # (b, L, N) each
        a = -torch.exp(self.a_log)  # (D, N)
        decay = torch.exp(delta.unsqueeze(-1) * a)  # (b, L, D, N)
        drive = (delta * u).unsqueeze(-1) * b_t.unsqueeze(2)  # (b, L, D, N)
        h = x.new_zeros(x.shape[0], u.shape[-1], a.shape[-1])
        ys = []
        for t in range(x.shape[1]):
            h = decay[:, t] * h + drive[:, t]
            ys.append((h * c_t[:, t].unsqueeze(1)).sum(dim=-1))
        y = torch.stack(ys, dim=1) + u * self.skip
        return self.out_proj(y * F.silu(z))


batch = 2  # gpu: 256
length = 16  # gpu: 32
d_model = 32  # gpu: 512
d_inner = 64  # gpu: 1024
d_state = 8  # gpu: 32


def get_inputs():
    return [torch.randn(batch, length, d_model)]


def get_init_inputs():
    return [d_model, d_inner, d_state]
