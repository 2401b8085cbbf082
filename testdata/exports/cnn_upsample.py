#!/usr/bin/python3
"""Exports a small U-Net-like CNN with upsampling as cnn_upsample.onnx (opset 17).

What it builds (plain torch, random deterministic weights and BatchNorm statistics, eval mode):
  image [batch, 3, 32, 32]
  -> Conv+BatchNorm+ReLU (16 ch, 32x32) = s1 -> MaxPool 2
  -> Conv+BatchNorm+ReLU (32 ch, 16x16) = s2 -> MaxPool 2
  -> Conv+BatchNorm+ReLU (32 ch, 8x8)
  -> F.interpolate(scale_factor=2, mode="nearest")              -> cat with s2 (skip) -> block (32 ch)
  -> nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False) -> cat with s1 (skip)
  -> Conv+BatchNorm+ReLU (16 ch, stride 2, 16x16) -> MaxPool 4 (4x4)
  -> x.reshape(x.shape[0], -1)  (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)
  -> Linear(256, 10) = logits [batch, 10]

The export keeps the BatchNormalization nodes (training=TrainingMode.PRESERVE on a module in eval
mode, so they are exported as inference BatchNormalization); with the default TrainingMode.EVAL,
torch 1.13 would fold every BatchNorm into the preceding Conv while exporting.

Why: test data for ctxgen's handling of real torch.onnx exports -- a symbolic batch dimension
("batch", made static with --fix-dim batch=1), shape arithmetic feeding a Reshape, Resize in both
nearest and linear modes, skip connections with Concat, and BatchNorm folding in the backend.

Regenerate (from the repository root; needs Debian's python3-torch and python3-onnx):
    /usr/bin/python3 testdata/exports/cnn_upsample.py
The .onnx file is written next to this script.
"""
import os
import warnings

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

from describe import describe

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17


def block(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class UpsampleNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.enc1 = block(3, 16)
        self.enc2 = block(16, 32)
        self.mid = block(32, 32)
        self.dec2 = block(64, 32)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec1 = block(48, 16, stride=2)
        self.pool = nn.MaxPool2d(2)
        self.head_pool = nn.MaxPool2d(4)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        s1 = self.enc1(x)                                   # 16 x 32 x 32
        s2 = self.enc2(self.pool(s1))                       # 32 x 16 x 16
        x = self.mid(self.pool(s2))                         # 32 x 8 x 8
        x = F.interpolate(x, scale_factor=2, mode="nearest")  # 32 x 16 x 16
        x = self.dec2(torch.cat((x, s2), dim=1))            # 32 x 16 x 16
        x = self.up1(x)                                     # 32 x 32 x 32
        x = self.dec1(torch.cat((x, s1), dim=1))            # 16 x 16 x 16
        x = self.head_pool(x)                               # 16 x 4 x 4
        x = x.reshape(x.shape[0], -1)                       # 256
        return self.fc(x)


def build():
    torch.manual_seed(0)
    net = UpsampleNet()
    with torch.no_grad():
        # Non-trivial BatchNorm parameters and statistics, so folding them is observable.
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1.0 + 0.2 * torch.randn_like(m.weight))
                m.bias.copy_(0.1 * torch.randn_like(m.bias))
                m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))
    return net.eval()


def main():
    net = build()
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = net(image)
    print("torch: logits %s, mean %.4f" % (tuple(logits.shape), logits.mean().item()))

    path = os.path.join(HERE, "cnn_upsample.onnx")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(net, (image,), path, opset_version=OPSET, input_names=["image"],
                          output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True)
    for w in caught:
        print("   exporter warning: %s: %s" % (w.category.__name__, str(w.message).splitlines()[0]))
    model = describe(path)
    dims0 = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims0 == ["batch", 3, 32, 32], dims0


if __name__ == "__main__":
    main()
