import torch

DESCRIPTION = ("GEMM with a fused epilogue in bf16: GELU(x @ W^T + b) (nn.Linear 2048->8192, exact erf GELU) "
               "on 2048 tokens, the up-projection of a transformer MLP.")

TOKENS = 2048
IN_FEATURES = 2048
OUT_FEATURES = 8192

FLOPS = 2 * TOKENS * IN_FEATURES * OUT_FEATURES


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = torch.nn.Linear(in_features, out_features, bias=True).to(torch.bfloat16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES, dtype=torch.bfloat16)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
