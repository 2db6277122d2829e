import torch

DESCRIPTION = "GELU with the tanh approximation, elementwise on a large 8192x16384 fp32 tensor (memory bound)."

ROWS = 8192
COLS = 16384


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
