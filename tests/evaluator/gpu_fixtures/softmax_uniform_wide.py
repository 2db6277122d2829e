"""Row softmax of a (64, 65536) fp32 tensor of uniform [0, 1) values (test fixture).

Every output lies near 1/65536, below atol: only the relative-norm bound tells
a constant answer from the softmax (tests/adversarial/cases/29_constant_answer.md).
"""
import torch

DESCRIPTION = "Softmax over dim 1 of uniform inputs (test fixture)."


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(64, 65536)]


def get_init_inputs():
    return []
