import torch

DESCRIPTION = ("RMSNorm over the last dim (4096) of a 16384x4096 fp32 tensor, with a learned weight: "
               "y = x / sqrt(mean(x^2) + eps) * weight, eps 1e-6.")

TOKENS = 16384
HIDDEN = 4096
EPS = 1e-6


class Model(torch.nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
