import torch

DESCRIPTION = "Batched matrix multiplication in bf16: 32 independent 1024x1024 @ 1024x1024 products."

BATCH = 32
M = 1024
K = 1024
N = 1024

FLOPS = 2 * BATCH * M * N * K


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(BATCH, M, K, dtype=torch.bfloat16), torch.randn(BATCH, K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
