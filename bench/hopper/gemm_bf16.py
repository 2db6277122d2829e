import torch
import torch.nn as nn

DESCRIPTION = "C = A @ B^T in bf16 with fp32 accumulation (a Linear layer's product): A 8192 x 8192, B 8192 x 8192"
FLOPS = 2 * 8192 * 8192 * 8192
M = N = K = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
