import torch

DESCRIPTION = "Sum over dim=1 of a 16384x16384 fp32 tensor (row reduction, memory bound)."

ROWS = 16384
COLS = 16384

# Sums of 16384 values of magnitude ~1: order-dependent fp32 rounding reaches ~1e-3 absolute.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-4}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
