"""a + b on 8 elements: small enough that a cheat can hard-code one input set's answer."""
import torch

DESCRIPTION = "Add two 8-element vectors (test fixture)."


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(8), torch.randn(8)]


def get_init_inputs():
    return []
