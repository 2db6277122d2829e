"""out = x (a copy) of 2^26 fp32 elements (256 MiB each way, five times the
H100's L2): a DRAM-bound fixture for the hardware-counter tests."""
import torch

DESCRIPTION = "A copy of a 256 MiB tensor (test fixture)."


class Model(torch.nn.Module):
    def forward(self, x):
        return x.clone()


def get_inputs():
    return [torch.randn(1 << 13, 1 << 13)]


def get_init_inputs():
    return []
