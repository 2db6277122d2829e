"""ReLU on 4096 x 393216 fp32 (6 GiB in, 6 GiB out): KernelBench level 1's
19_ReLU at its real size, for the agent on a multi-GB problem (issue 32)."""
import torch

DESCRIPTION = "ReLU on a 6 GiB tensor (test fixture at KernelBench's size)."


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4096, 393216)]


def get_init_inputs():
    return []
