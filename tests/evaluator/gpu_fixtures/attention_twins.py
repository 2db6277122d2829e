"""softmax(q k^T) v with keys in twins one float32 rounding apart (issue 36):
at the logits of the x 1e5 shifted set, PyTorch's float32 output picks the
wrong twin of a softmax on many rows (it is far from float64 there), so an
exact kernel must be judged against float64, never against PyTorch's rounding."""
import torch

DESCRIPTION = "Attention softmax(q k^T) v, 4 x 64 x 16, keys in near-identical twins (test fixture)."


class Model(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def get_inputs():
    b, n, d = 4, 64, 16
    q = torch.randn(b, n, d)
    k = torch.randn(b, n // 2, d)
    k = torch.stack([k, k * (1 + 2e-7 * torch.randn(b, n // 2, d))], dim=2).reshape(b, n, d)
    return [q, k, torch.randn(b, n, d)]


def get_init_inputs():
    return []
