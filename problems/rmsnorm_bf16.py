import torch

DESCRIPTION = ("RMSNorm in bf16 over the last dim (4096) of a 16384x4096 tensor with a bf16 weight; "
               "statistics and scaling in fp32, one rounding to bf16 at the end (eps 1e-6).")

TOKENS = 16384
HIDDEN = 4096
EPS = 1e-6


class Model(torch.nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter((1.0 + 0.1 * torch.randn(hidden)).to(torch.bfloat16))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, EPS]
