"""C = A @ B, fp32, 1024^3: a compute-bound fixture with FLOPS for the roofline."""
import torch

DESCRIPTION = "C = A @ B for two 1024x1024 fp32 matrices (test fixture)."
TOLERANCE = {"atol": 1e-3, "rtol": 1e-3}
FLOPS = 2 * 1024 * 1024 * 1024


class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


def get_init_inputs():
    return []
