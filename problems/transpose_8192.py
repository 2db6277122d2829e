import torch

DESCRIPTION = "Transpose of an 8192x8192 fp32 matrix into a contiguous output (pure data movement)."

N = 8192


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.t().contiguous()


def get_inputs():
    return [torch.randn(N, N)]


def get_init_inputs():
    return []
