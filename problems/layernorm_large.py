import torch

DESCRIPTION = ("LayerNorm over the last three dims (64,256,256) of a 16x64x256x256 fp32 tensor, "
               "with elementwise affine weight and bias (16 rows of 4M elements each).")

BATCH = 16
NORMALIZED_SHAPE = (64, 256, 256)


class Model(torch.nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape)  # eps 1e-5
        # Random affine parameters (seeded by the bridge), so a kernel that ignores them fails.
        with torch.no_grad():
            self.ln.weight.copy_(1.0 + 0.1 * torch.randn(normalized_shape))
            self.ln.bias.copy_(0.1 * torch.randn(normalized_shape))

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(BATCH, *NORMALIZED_SHAPE)]


def get_init_inputs():
    return [NORMALIZED_SHAPE]
