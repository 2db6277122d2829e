"""C = A @ B in fp16, 1024^3: the tensor-pipe fixture of the hardware-counter tests."""
import torch

DESCRIPTION = "C = A @ B for two 1024x1024 fp16 matrices (test fixture)."


class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(1024, 1024, dtype=torch.float16), torch.randn(1024, 1024, dtype=torch.float16)]


def get_init_inputs():
    return []
