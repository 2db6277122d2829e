import torch

DESCRIPTION = "Dense fp32 matrix multiplication C = A @ B with square 4096x4096 operands."

M = 4096
K = 4096
N = 4096

FLOPS = 2 * M * N * K
# Sums of 4096 products: fp32 results differ with summation order by ~1e-4..1e-3.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-3}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
