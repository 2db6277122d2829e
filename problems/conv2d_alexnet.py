import torch

DESCRIPTION = ("AlexNet's first convolution in fp32: Conv2d 3->96 channels, kernel 11, stride 4, "
               "padding 2, with bias, on a batch of 100 images of 224x224.")

BATCH = 100
IN_CH = 3
OUT_CH = 96
H = W = 224
KSIZE = 11
STRIDE = 4
PAD = 2
OH = (H + 2 * PAD - KSIZE) // STRIDE + 1  # 55
OW = (W + 2 * PAD - KSIZE) // STRIDE + 1  # 55

FLOPS = 2 * BATCH * OUT_CH * OH * OW * IN_CH * KSIZE * KSIZE
# cuDNN computes the fp32 reference with TF32 unless torch.backends.cudnn.allow_tf32 is off
# (on by default): TF32 and exact fp32 differ by up to ~1e-3 here (outputs up to ~3.5), so
# the tolerance admits both a TF32 and an exact reference, and TF32 candidates.
TOLERANCE = {"atol": 5e-3, "rtol": 5e-3}


class Model(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size,
                                    stride=stride, padding=padding, bias=True)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH, KSIZE, STRIDE, PAD]
