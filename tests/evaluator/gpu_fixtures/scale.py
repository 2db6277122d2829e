"""out = x * 2 + 1 on a (1024, 1024) fp32 tensor: the adversarial suite's target."""
import torch

DESCRIPTION = "Elementwise x * 2 + 1 (test fixture)."


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
