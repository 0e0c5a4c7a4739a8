import torch
import torch.nn as nn
import torch.nn.functional as F

# KernelBench L2-52's shape of model (a convolution, x * tanh(softplus(x)), a batch norm in
# training mode), small, with cuDNN's TF32 done by hand on the CPU: the convolution's operands are
# rounded to TF32 whenever the flag is on (PyTorch's default), as matmul_tf32_flag does for a
# matmul. Its error at the defaults has another shape at the range trials' scales than at the
# typical draws' (0.0019 of the outputs' RMS at most at scale 1, 0.024 at 1e6).


def _tf32(x):
    if x.dtype != torch.float32 or not torch.backends.cudnn.allow_tf32:
        return x
    return ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        x = F.conv2d(_tf32(x), _tf32(self.conv.weight), self.conv.bias)
        x = torch.multiply(torch.tanh(torch.nn.functional.softplus(x)), x)
        return self.bn(x)


def get_inputs():
    return [torch.rand(2, 32, 10, 10)]


def get_init_inputs():
    return [32, 64, 3]
