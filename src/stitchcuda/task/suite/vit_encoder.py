"""Small Vision Transformer (inference): patch embedding by a stride-16 convolution,
a learned class token and position embedding, two pre-LayerNorm encoder blocks
(explicit multi-head self-attention and a GELU MLP, each behind a residual), a
final LayerNorm and a linear classifier on the class token.

The sequence length is 197 (196 patches plus the class token), an awkward size
for attention tiles; the token-wise GEMMs of the two blocks dominate. Roughly
4-5 ms eagerly on an H100 in true fp32: 6304 tokens through two blocks of
2 x 6304 x 768 x (2304 + 768 + 2 x 3072) = 89 GFLOP each plus 3.8 GFLOP of
attention matmuls each, and a 7.4 GFLOP patch embedding, about 190 GFLOP in all
(about 3.8 ms at 50 TFLOP/s), with about 1 GB of score, norm and activation
traffic (0.3 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_hidden)
        self.fc2 = nn.Linear(mlp_hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.softmax(torch.matmul(q * (self.head_dim**-0.5), k.transpose(-2, -1)), dim=-1)
        x = x + self.proj(torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Model(nn.Module):
    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_hidden: int,
        num_classes: int,
    ):
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, num_patches + 1, dim))
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, mlp_hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


batch = 32
image_size = 224
patch_size = 16
in_channels = 3
dim = 768
depth = 2
num_heads = 12
mlp_hidden = 3072
num_classes = 1000
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {
    "tiny": {"batch": 2, "image_size": 8, "patch_size": 4, "dim": 12, "num_heads": 3, "mlp_hidden": 20,
             "num_classes": 5},
}


def get_inputs():
    return [torch.randn(batch, in_channels, image_size, image_size)]


def get_init_inputs():
    return [image_size, patch_size, in_channels, dim, depth, num_heads, mlp_hidden, num_classes]
