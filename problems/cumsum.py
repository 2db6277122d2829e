import torch

DESCRIPTION = "Inclusive prefix sum (cumsum) over dim=1 of a 4096x8192 fp32 tensor (a scan along each row)."

ROWS = 4096
COLS = 8192

# Prefix sums of up to 8192 values: order-dependent fp32 rounding reaches ~1e-3 absolute.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-4}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
