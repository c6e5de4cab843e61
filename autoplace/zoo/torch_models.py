"""Small real architectures in PyTorch (random weights), imported through ``torch.export``.

Each is a scaled-down version of a family autoplace targets: residual CNN, depthwise-separable
mobile CNN, a branchy Inception block, a transformer encoder layer. Sizes keep import + build +
run within a few seconds on a 2-core machine.
"""

from __future__ import annotations

import numpy as np


def _nn():
    import torch
    from torch import nn

    return torch, nn


def _reinit(model, seed: int):
    """Random BatchNorm statistics and affine terms, so outputs are O(1) and numerics meaningful."""
    torch, nn = _nn()
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act=True):
    _, nn = _nn()
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6() if groups > 1 or k == 1 else nn.ReLU())
    return nn.Sequential(*layers)


def resnet(seed: int = 0):
    """ResNet-style: stem, 2 stages of 2 basic blocks (16 and 32 channels), 32x32 input."""
    torch, nn = _nn()
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, 3, act=False))
            self.skip = (nn.Identity() if stride == 1 and cin == cout
                         else _conv_bn(cin, cout, 1, stride, act=False))

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    model = nn.Sequential(_conv_bn(3, 16), Block(16, 16, 1), Block(16, 16, 1), Block(16, 32, 2),
                          Block(32, 32, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return _reinit(model, seed), [(1, 3, 32, 32)]


def mobilenet(seed: int = 0):
    """MobileNetV2-style inverted residuals with depthwise 3x3 convs, 32x32 input."""
    torch, nn = _nn()
    torch.manual_seed(seed)

    class Inverted(nn.Module):
        def __init__(self, cin, cout, stride, expand=4):
            super().__init__()
            mid = cin * expand
            self.body = nn.Sequential(_conv_bn(cin, mid, 1), _conv_bn(mid, mid, 3, stride, groups=mid),
                                      _conv_bn(mid, cout, 1, act=False))
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    model = nn.Sequential(_conv_bn(3, 16, 3, 2), Inverted(16, 16, 1), Inverted(16, 24, 2),
                          Inverted(24, 24, 1), Inverted(24, 32, 2), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    return _reinit(model, seed), [(1, 3, 32, 32)]


def inception(seed: int = 0):
    """A stem and two Inception blocks (1x1 / 1x1-3x3 / 1x1-3x3-3x3 / pool-1x1 branches), 32x32."""
    torch, nn = _nn()
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin, c):
            super().__init__()
            self.b1 = _conv_bn(cin, c, 1)
            self.b2 = nn.Sequential(_conv_bn(cin, c, 1), _conv_bn(c, c, 3))
            self.b3 = nn.Sequential(_conv_bn(cin, c, 1), _conv_bn(c, c, 3), _conv_bn(c, c, 3))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn(cin, c, 1))

        def forward(self, x):
            return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)

    model = nn.Sequential(_conv_bn(3, 16, 3, 2), Block(16, 8), Block(32, 8), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    return _reinit(model, seed), [(1, 3, 32, 32)]


def transformer(seed: int = 0):
    """One pre-norm transformer encoder layer: 4-head self-attention and a GELU MLP, seq 32, d 64."""
    torch, nn = _nn()
    torch.manual_seed(seed)
    d, heads, seq = 64, 4, 32

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-2, -1) / (d // heads) ** 0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(self.ln2(x))

    return _reinit(Encoder(), seed), [(1, seq, d)]


def example_inputs(shapes, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype("float32") for s in shapes]
