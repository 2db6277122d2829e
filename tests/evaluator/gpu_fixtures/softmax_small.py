"""Row softmax of a (2048, 4096) fp32 tensor (test fixture)."""
import torch

DESCRIPTION = "Softmax over dim 1 (test fixture)."


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(2048, 4096)]


def get_init_inputs():
    return []
