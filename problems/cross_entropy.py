import torch

DESCRIPTION = ("Cross-entropy loss of fp32 logits (4096 tokens x 32000-word vocabulary) against int64 "
               "class targets, mean over tokens; the output is a 0-d scalar.")

TOKENS = 4096
VOCAB = 32000


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        return torch.nn.functional.cross_entropy(logits, targets)


def get_inputs():
    return [torch.randn(TOKENS, VOCAB), torch.randint(0, VOCAB, (TOKENS,), dtype=torch.int64)]


def get_init_inputs():
    return []
