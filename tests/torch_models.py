"""Small PyTorch models the torch-device tests share (import after ``pytest.importorskip("torch")``)."""

import torch


class ConvNet(torch.nn.Module):
    """conv -> bias + relu (one fused TVM kernel; one chain of a PyTorch call) -> max pool ->
    mean -> layer norm -> linear -> softmax."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.nn.functional.max_pool2d(y, 2).mean((2, 3))
        return torch.softmax(self.fc(self.norm(y)), -1)


def convnet():
    """``(model, example input)`` of :class:`ConvNet`, seeded."""
    torch.manual_seed(0)
    return ConvNet().eval(), torch.randn(1, 8, 16, 16)


class Lacking(torch.nn.Module):
    """A conv, then three ops the importer lacks (adaptive_max_pool2d, cdist, searchsorted)
    beside TVM ops, and one whose output shape depends on the data (nonzero)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x, y):
        a = torch.nn.functional.adaptive_max_pool2d(self.conv(x), 3).relu()
        d = torch.cdist(x.flatten(2)[0], y)
        s = torch.searchsorted(torch.arange(10.0), y.flatten()) + 1
        n = torch.nonzero(x > 0.5).float().sum(0)
        return a, d, s, n


class SkipNorm(torch.nn.Module):
    """A linear layer, a residual add and a layer norm: ORT fuses the add and the norm into one
    ``SkipLayerNormalization`` node."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(x + self.lin(x))


def skip_norm():
    """``(model, example input)`` of :class:`SkipNorm`, seeded."""
    torch.manual_seed(0)
    return SkipNorm().eval(), torch.randn(1, 16, 32)
