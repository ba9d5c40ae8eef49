"""The zoo's own architectures: forms users write that the libraries' models do not cover (patches cut
with ``unfold``, a tensor-bound ``clamp``, top-k expert routing, softmax inside a U-Net's blocks in
training mode, a ViT front end from ``nn.TransformerEncoderLayer``, MBConv blocks in training mode,
a small RNN cell that keeps its state between calls).

benchmarks/zoo.py copies each class's source into the task files that use it (``OWN`` below names
them), so every task file stays a standalone KernelBench-format program.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class _Block(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class _UNet(nn.Module):
    def __init__(self, channels=3, classes=4, width=32, block=_Block):
        super().__init__()
        self.down1, self.down2, self.down3 = block(channels, width), block(width, 2 * width), block(2 * width, 4 * width)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        d3 = self.down3(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(d3), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return torch.softmax(self.head(u1), dim=1)


class _SoftmaxBlock(nn.Sequential):
    """Convolution, BatchNorm, then a softmax over the width, twice: BatchNorm on batch statistics in
    training mode feeds a softmax along the image's rows."""

    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.Softmax(dim=-1),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.Softmax(dim=-1))


class _UnfoldViT(nn.Module):
    """A ViT that cuts its patches with Tensor.unfold (a strided view) and embeds them with a Linear."""

    def __init__(self, image=64, patch=8, width=128, depth=2, heads=4, classes=10):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, width)
        self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        b, c, p = x.shape[0], x.shape[1], self.patch
        patches = x.unfold(2, p, p).unfold(3, p, p)  # b, c, rows, columns, p, p
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
        tokens = torch.cat([self.cls.expand(b, -1, -1), self.embed(patches)], dim=1) + self.pos
        return self.head(self.norm(self.encoder(tokens)[:, 0]))


class _Im2colConv(nn.Module):
    """Convolutions written as F.unfold (im2col) and a matrix product, with a strided second layer."""

    def __init__(self, channels=16, width=32):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(width, channels * 9) * (channels * 9) ** -0.5)
        self.w2 = nn.Parameter(torch.randn(width, width * 4) * (width * 4) ** -0.5)

    def forward(self, x):
        b, _, h, w = x.shape
        y = (self.w1 @ nn.functional.unfold(x, 3, padding=1)).view(b, -1, h, w).relu()
        z = self.w2 @ nn.functional.unfold(y, 2, stride=2)
        return z.view(b, -1, h // 2, w // 2)


class _CosineAttention(nn.Module):
    """Scaled cosine attention as SwinV2 writes it: a learned logit scale clamped by a tensor bound,
    and activations clamped by per-channel tensor bounds."""

    def __init__(self, width=128, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads, 1, 1)))
        self.register_buffer("floor", -2.0 - torch.rand(width))
        self.register_buffer("ceiling", 2.0 + torch.rand(width))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(-2, -1)
        scale = torch.clamp(self.logit_scale, max=torch.log(torch.tensor(1.0 / 0.01, device=x.device))).exp()
        out = ((attn * scale).softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)
        return torch.clamp(self.proj(out), min=self.floor, max=self.ceiling)


class _TopKMoE(nn.Module):
    """A top-k mixture of experts routed as users write it: torch.where on the choice, the chosen rows
    gathered, each expert run on its rows, the results added back with index_add_."""

    def __init__(self, width=128, hidden=256, experts=8, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
                                     for _ in range(experts))

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(self.gate(tokens).softmax(dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            out.index_add_(0, rows, expert(tokens[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


class _ViTFront(nn.Module):
    """A ViT front end: patch convolution, class token, pre-norm TransformerEncoderLayers (GELU), the
    class token out."""

    def __init__(self, image=224, patch=16, width=256, depth=4, heads=8):
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        self.layers = nn.Sequential(*[nn.TransformerEncoderLayer(width, heads, 4 * width, activation="gelu",
                                                                 batch_first=True, norm_first=True)
                                      for _ in range(depth)])

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        return self.layers(tokens)[:, 0]


class _MBConv(nn.Module):
    """EfficientNet's inverted bottleneck: expand, depthwise, squeeze-excitation, project; BatchNorm
    after each convolution, a residual where the shape allows."""

    def __init__(self, cin, cout, expand, kernel, stride):
        super().__init__()
        mid = cin * expand
        self.residual = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()) \
            if expand != 1 else nn.Identity()
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
                                       nn.BatchNorm2d(mid), nn.SiLU())
        squeezed = max(1, cin // 4)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, squeezed, 1), nn.SiLU(),
                                nn.Conv2d(squeezed, mid, 1), nn.Sigmoid())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class _MBNet(nn.Module):
    """An EfficientNet-B2-sized network of MBConv blocks, in training mode (BatchNorm on batch
    statistics), as KernelBench leaves a model."""

    STAGES = [(1, 16, 2, 3, 1), (6, 24, 3, 3, 2), (6, 48, 3, 5, 2), (6, 88, 4, 3, 2), (6, 120, 4, 5, 1),
              (6, 208, 5, 5, 2), (6, 352, 2, 3, 1)]  # expand, channels, repeats, kernel, stride

    def __init__(self, classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
        cin = 32
        for expand, cout, repeats, kernel, stride in self.STAGES:
            for i in range(repeats):
                layers.append(_MBConv(cin, cout, expand, kernel, stride if i == 0 else 1))
                cin = cout
        layers += [nn.Conv2d(cin, 1408, 1, bias=False), nn.BatchNorm2d(1408), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                   nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1408, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class _StatefulCell(nn.Module):
    """A small RNN cell that keeps its hidden state between calls (self.hidden is reassigned each
    forward): a few tiny products a call."""

    def __init__(self, inputs=64, hidden=128, batch=8):
        super().__init__()
        self.i2h = nn.Linear(inputs + hidden, hidden)
        self.h2o = nn.Linear(hidden, 32)
        self.hidden = torch.randn(batch, hidden)

    def forward(self, x):
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden.to(x.device)), dim=1)))
        return self.h2o(self.hidden)


# name: (classes whose source the task needs, build, forward, args, inputs, kind, eval mode, about)
OWN = {
    "own_unet_softmax": (["_Block", "_UNet"], "self.net = _UNet()", "return self.net(x)", "x",
                         "[torch.randn(4, 3, 128, 128)]", "cnn", None,
                         "A U-Net of our own (3 levels, 32-128 wide, transposed-convolution upsampling, skip "
                         "concatenations) whose per-pixel class scores go through a softmax."),
    "own_unet_softmax_blocks": (["_Block", "_UNet", "_SoftmaxBlock"], "self.net = _UNet(4, 4, 16, _SoftmaxBlock)",
                                "return self.net(x)", "x", "[torch.randn(4, 4, 32, 256)]", "cnn", None,
                                "A U-Net of our own whose blocks end in BatchNorm then a softmax over the width, "
                                "in training mode, on wide flat inputs (4 x 4 x 32 x 256)."),
    "own_vit_unfold": (["_UnfoldViT"], "self.net = _UnfoldViT()", "return self.net(x)", "x",
                       "[torch.randn(4, 3, 64, 64)]", "transformer", None,
                       "A ViT of our own that cuts 8x8 patches with Tensor.unfold (2 pre-norm layers, 128 wide)."),
    "own_im2col_conv": (["_Im2colConv"], "self.net = _Im2colConv()", "return self.net(x)", "x",
                        "[torch.randn(4, 16, 32, 32)]", "cnn", None,
                        "Two convolutions of our own written as F.unfold and a matrix product."),
    "own_cosine_attention": (["_CosineAttention"], "self.net = _CosineAttention()", "return self.net(x)", "x",
                             "[torch.randn(4, 64, 128)]", "transformer", None,
                             "SwinV2-style scaled cosine attention of our own: a logit scale clamped by a "
                             "tensor bound, outputs clamped by per-channel tensor bounds."),
    "own_moe_topk": (["_TopKMoE"], "self.net = _TopKMoE()", "return self.net(x)", "x",
                     "[torch.randn(4, 64, 128)]", "transformer", None,
                     "A top-2-of-8 mixture of experts of our own, routed with torch.where and index_add_."),
    "own_vit_front": (["_ViTFront"], "self.net = _ViTFront()", "return self.net(x)", "x",
                      "[torch.randn(4, 3, 224, 224)]", "transformer", None,
                      "A ViT front end of our own: patch convolution, class token, 4 pre-norm "
                      "nn.TransformerEncoderLayers (GELU, batch-first, 256 wide): the class token."),
    "own_rnn_cell_state": (["_StatefulCell"], "self.net = _StatefulCell()", "return self.net(x)", "x",
                           "[torch.randn(8, 64)]", "recurrent", None,
                           "A small RNN cell of our own that keeps its hidden state between calls."),
    "own_mbnet_train": (["_MBConv", "_MBNet"], "self.net = _MBNet()", "return self.net(x)", "x",
                        "[torch.randn(2, 3, 224, 224)]", "cnn", None,
                        "An EfficientNet-B2-sized network of our own (MBConv blocks, squeeze-excitation, "
                        "BatchNorm), in training mode: its logits."),
}
