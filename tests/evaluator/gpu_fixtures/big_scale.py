"""x * 2 + 1 on 2^29 fp32 elements (2 GiB in, 2 GiB out): the multi-GB path."""
import torch

DESCRIPTION = "Elementwise x * 2 + 1 on a 2 GiB tensor (test fixture)."


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(1 << 15, 1 << 14)]


def get_init_inputs():
    return []
