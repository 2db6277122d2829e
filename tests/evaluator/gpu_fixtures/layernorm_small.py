"""LayerNorm over the last dim of a (4096, 1024) fp32 tensor, with weight and bias (test fixture)."""
import torch

DESCRIPTION = "LayerNorm over 1024 features (test fixture)."


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(1024)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(4096, 1024)]


def get_init_inputs():
    return []
