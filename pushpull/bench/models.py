"""Models for benchmarks and profiles, defined here so that no download and no
torchvision is needed.

Two families:

* the paper models, with layer shapes equal to the reference implementations
  (torchvision VGG-16 / ResNet-50, Hugging Face BERT-base/large and GPT-2 built
  from their default configs), so that gradient sizes in profiles and
  simulations are the real ones;
* small variants (``resnet_small``, ``vgg_small``, ``mlp``, ``bert_tiny``) that
  train in seconds on a CPU, for real end-to-end runs on the emulated cluster.

``build_model(name)`` returns a module; ``example_batch(name, batch_size)``
returns ``(inputs, loss_fn)`` where ``loss_fn(model, inputs)`` runs forward and
returns a scalar loss, so callers need not know the model family.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------
# VGG (torchvision layout: features / avgpool / classifier)
# --------------------------------------------------------------------------

VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG(nn.Module):
    """VGG without batch norm; ``width`` divides the channel counts (1 = VGG-16)."""

    def __init__(self, cfg=VGG16_CFG, num_classes: int = 1000, width: int = 1,
                 pool_size: int = 7, hidden: int = 4096, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                c = v // width
                layers += [nn.Conv2d(c_in, c, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                c_in = c
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((pool_size, pool_size))
        self.classifier = nn.Sequential(
            nn.Linear(c_in * pool_size * pool_size, hidden), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# --------------------------------------------------------------------------
# ResNet (torchvision layout: conv1 bn1 relu maxpool layer1-4 avgpool fc)
# --------------------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idt = x if self.downsample is None else self.downsample(x)
        return self.relu(out + idt)


class Bottleneck(nn.Module):
    """torchvision v1.5 bottleneck: the stride sits on the 3x3 conv."""
    expansion = 4

    def __init__(self, c_in, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        # same call order as torchvision, so profiles list layers in its order
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        idt = x if self.downsample is None else self.downsample(x)
        return self.relu(out + idt)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000, base: int = 64, small_input: bool = False):
        super().__init__()
        self.c_in = base
        if small_input:  # CIFAR-style stem: 3x3 conv, no max-pool
            self.conv1 = nn.Conv2d(3, base, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make(block, base, layers[0], 1)
        self.layer2 = self._make(block, base * 2, layers[1], 2)
        self.layer3 = self._make(block, base * 4, layers[2], 2)
        self.layer4 = self._make(block, base * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base * 8 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make(self, block, planes, n, stride):
        down = None
        if stride != 1 or self.c_in != planes * block.expansion:
            down = nn.Sequential(nn.Conv2d(self.c_in, planes * block.expansion, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * block.expansion))
        blocks = [block(self.c_in, planes, stride, down)]
        self.c_in = planes * block.expansion
        blocks += [block(self.c_in, planes) for _ in range(1, n)]
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MLP(nn.Module):
    def __init__(self, d_in=784, hidden=(512, 256), num_classes=10):
        super().__init__()
        dims = [d_in, *hidden]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        for lin in self.layers:
            x = F.relu(lin(x))
        return self.head(x)


# --------------------------------------------------------------------------
# Transformers (built from configs: no download)
# --------------------------------------------------------------------------

def _bert(kind: str, **kw):
    from transformers import BertConfig, BertForPreTraining

    presets = {
        "bert_base": {},
        "bert_large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
        "bert_tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                          vocab_size=8192, max_position_embeddings=256),
    }
    cfg = BertConfig(**{**presets[kind], **kw})
    return BertForPreTraining(cfg)


def _gpt2(kind: str, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    presets = {
        "gpt2": {},
        "gpt2_tiny": dict(n_embd=128, n_layer=2, n_head=2, vocab_size=8192, n_positions=256,
                          bos_token_id=0, eos_token_id=0),
    }
    return GPT2LMHeadModel(GPT2Config(**{**presets[kind], **kw}))


# name -> (builder, input kind, default input geometry)
_IMAGE_224 = ("image", 224, 1000)
_IMAGE_32 = ("image", 32, 10)

MODELS: dict[str, tuple[Callable[..., nn.Module], tuple]] = {
    "vgg16": (lambda **kw: VGG(**kw), _IMAGE_224),
    "resnet50": (lambda **kw: ResNet(Bottleneck, [3, 4, 6, 3], **kw), _IMAGE_224),
    # CPU-friendly: CIFAR-sized inputs, narrow channels
    "resnet_small": (lambda **kw: ResNet(BasicBlock, [1, 1, 1, 1], **{"num_classes": 10, "base": 16,
                                                                       "small_input": True, **kw}), _IMAGE_32),
    "vgg_small": (lambda **kw: VGG(**{"width": 8, "num_classes": 10, "pool_size": 1, "hidden": 256,
                                      "dropout": 0.0, **kw}), _IMAGE_32),
    "mlp": (lambda **kw: MLP(**kw), ("flat", 784, 10)),
    "bert_base": (lambda **kw: _bert("bert_base", **kw), ("bert", 128, 30522)),
    "bert_large": (lambda **kw: _bert("bert_large", **kw), ("bert", 128, 30522)),
    "bert_tiny": (lambda **kw: _bert("bert_tiny", **kw), ("bert", 64, 8192)),
    "gpt2": (lambda **kw: _gpt2("gpt2", **kw), ("gpt2", 128, 50257)),
    "gpt2_tiny": (lambda **kw: _gpt2("gpt2_tiny", **kw), ("gpt2", 64, 8192)),
}


def model_names() -> list[str]:
    return list(MODELS)


def build_model(name: str, **kw) -> nn.Module:
    """Build a model by name; ``kw`` goes to the constructor / config."""
    try:
        builder, _ = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
    return builder(**kw)


def example_batch(name: str, batch_size: int, seq_len: int | None = None, device="cpu",
                  seed: int = 0) -> tuple[dict, Callable[[nn.Module, dict], torch.Tensor]]:
    """Synthetic inputs for ``name`` and a loss function ``loss_fn(model, batch)``.

    Synthetic data makes the compute time a property of the model alone
    (no data loader, no download), which is what profiles need.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    kind, size, classes = MODELS[name][1]
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        batch = {"x": torch.randn(batch_size, 3, size, size, generator=g),
                 "y": torch.randint(0, classes, (batch_size,), generator=g)}

        def loss_fn(model, b):
            return F.cross_entropy(model(b["x"]), b["y"])
    elif kind == "flat":
        batch = {"x": torch.randn(batch_size, size, generator=g),
                 "y": torch.randint(0, classes, (batch_size,), generator=g)}

        def loss_fn(model, b):
            return F.cross_entropy(model(b["x"]), b["y"])
    elif kind == "bert":
        n = seq_len or size
        ids = torch.randint(0, classes, (batch_size, n), generator=g)
        batch = {"input_ids": ids,
                 "token_type_ids": torch.zeros_like(ids),
                 "labels": torch.randint(0, classes, (batch_size, n), generator=g),
                 "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)}

        def loss_fn(model, b):
            return model(**b).loss
    elif kind == "gpt2":
        n = seq_len or size
        ids = torch.randint(0, classes, (batch_size, n), generator=g)
        batch = {"input_ids": ids, "labels": ids}

        def loss_fn(model, b):
            return model(**b).loss
    else:  # pragma: no cover - table is closed
        raise AssertionError(kind)
    batch = {k: v.to(device) for k, v in batch.items()}
    return batch, loss_fn
