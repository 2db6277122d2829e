"""C = A @ B with get_inputs() in [0, 1) (torch.rand), as many KernelBench GEMMs:
a kernel that splits fp32 into two fp16 halves is exact here and not for the
inputs a user's model feeds it (issue 27's distribution-shifted sets)."""
import torch

DESCRIPTION = "C = A @ B for two 512x512 fp32 matrices with entries in [0, 1) (test fixture)."


class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(512, 512), torch.rand(512, 512)]


def get_init_inputs():
    return []
