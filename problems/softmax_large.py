import torch

DESCRIPTION = "Softmax over dim=1 of a 4096x65536 fp32 tensor (long rows; memory bound)."

ROWS = 4096
COLS = 65536


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
