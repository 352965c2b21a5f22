import torch
import torch.nn as nn


class Model(nn.Module):
    """Single-layer LSTM written out: Linear gate projections and a Python loop over time steps.

    Gates i, f, g, o from W_ih x_t + W_hh h_{t-1}; c_t = f*c_{t-1} + i*g; h_t = o*tanh(c_t); zero initial
    state. x: (B, T, D_in) -> every step's hidden state (B, T, H).
    """

    def __init__(self, d_in, hidden):
        super().__init__()
        self.hidden = hidden
        self.w_ih = nn.Linear(d_in, 4 * hidden)
        self.w_hh = nn.Linear(hidden, 4 * hidden)

    def forward(self, x):
        b, t_len, _ = x.shape
        gates_x = self.w_ih(x)  # input projections of every step at once
        h = x.new_zeros(b, self.hidden)
        c = x.new_zeros(b, self.hidden)
        outs = []
        for t in range(t_len):
            gates = gates_x[:, t] + self.w_hh(h)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1)


batch = 4  # gpu: 1024
steps = 12  # gpu: 16
d_in = 32  # gpu: 512
hidden = 48  # gpu: 1024


def get_inputs():
    return [2.0 * torch.randn(batch, steps, d_in)]


def get_init_inputs():
    return [d_in, hidden]
