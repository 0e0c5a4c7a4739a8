# Honest: a C++ extension through load_inline, built for the CPU.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    auto out = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    const float* b = y.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float s = a[i] + b[i];
        o[i] = s > 0.f ? s : 0.f;
    }
    return out;
}
"""

ext = load_inline(name="kf_add_relu_cpp", cpp_sources=CPP_SRC, functions=["add_relu"])


class ModelNew(nn.Module):
    def forward(self, x, y):
        return ext.add_relu(x.contiguous(), y.contiguous())
