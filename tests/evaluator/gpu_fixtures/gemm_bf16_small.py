import torch
import torch.nn as nn

DESCRIPTION = "C = A @ B^T in bf16 with fp32 accumulation (a Linear layer's product): A 512 x 256, B 768 x 256 (the benchmark kernel at a test size)"
FLOPS = 2 * 512 * 768 * 256
M, N, K = 512, 768, 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
