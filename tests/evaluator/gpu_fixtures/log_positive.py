import torch

DESCRIPTION = "log of positive inputs: negated inputs are outside its domain"


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.log(x)


def get_inputs():
    return [torch.rand(64, 256) + 0.1]


def get_init_inputs():
    return []
