# Honest: a CUDA kernel through load_inline (GPU only).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>

__global__ void add_relu_kernel(const float* x, const float* y, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float s = x[i] + y[i];
        out[i] = s > 0.f ? s : 0.f;
    }
}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    add_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
CPP_SRC = "torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);"

ext = load_inline(name="kf_add_relu_cuda", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC, functions=["add_relu"])


class ModelNew(nn.Module):
    def forward(self, x, y):
        return ext.add_relu(x.contiguous(), y.contiguous())
