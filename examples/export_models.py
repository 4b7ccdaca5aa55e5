#!/usr/bin/env python3
"""examples/export_models.py — exports real architectures to TorchScript for accumplan.

What it is: torchvision's resnet18, mobilenet_v3_small, squeezenet1_1 and vgg11 (random
initialisation, no downloads), a GPT-style decoder built from PyTorch's own TransformerEncoder
layers with a causal mask (token inputs, per-token loss with masked positions), and an LSTM
sequence classifier, each saved as `torch.jit.script(...)` under examples/models/, with a small
batch file (`torch.save([inputs..., target], f)`) and a manifest.json that the benchmark harness
reads (input specs, target, loss, optimizer, budgets). It also defines TokenTagger, a bidirectional
encoder tagger taking a padding mask, which tests/bench/tokens_bench.py exports itself (not here).
What it is not: training code. Generated files are build outputs and are not committed.

Run with the Python of the torch environment (scripts/torch-env.sh makes it and prints its path):
"$(bash scripts/torch-env.sh)" examples/export_models.py [--out DIR]
"""
import argparse
import json
import os
import sys
from typing import Optional

import torch
import torch.nn as nn
import torchvision

IMAGE = 64  # 64x64 images keep CPU steps short on 2 cores
# vgg11 at 32x32: its 3x3 convolutions at full width cost about 4x resnet18's per sample at the
# same size, and the benchmark runs it for dozens of real trials.
IMAGE_SIZES = {"vgg11": 32}


class CausalLM(nn.Module):
    """GPT-style decoder: token + position embeddings, causal self-attention blocks, LM head."""

    def __init__(self, vocab: int = 2048, context: int = 64, width: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), diagonal=1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        positions = torch.arange(t, device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        x = self.blocks(x, mask=self.mask[:t, :t])
        return self.head(self.norm(x))  # [B, T, vocab]


class TokenTagger(nn.Module):
    """Bidirectional token tagger: token + position embeddings, a TransformerEncoder that attends
    over the valid tokens only (src_key_padding_mask), per-token class logits [B, T, classes].

    forward(tokens, padding_mask): padding_mask is bool [B, T], true at padding (what
    `accumplan --padding-mask` passes). Without one (a fixed-shape data file, where no lengths are
    known), the mask is taken from the tokens: id `pad` (0) marks padding, so real tokens must
    avoid it.
    """

    def __init__(self, vocab: int = 2048, context: int = 512, width: int = 96, layers: int = 3, heads: int = 4,
                 classes: int = 16, pad: int = 0):
        super().__init__()
        self.pad = pad
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor, padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if padding_mask is None:
            padding_mask = tokens == self.pad
        t = tokens.size(1)
        positions = torch.arange(t, device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        x = self.blocks(x, src_key_padding_mask=padding_mask)
        return self.head(self.norm(x))  # [B, T, classes]


class LSTMClassifier(nn.Module):
    """Sequence classifier: embedding, 2-layer LSTM, the last hidden state to class logits."""

    def __init__(self, vocab: int = 5000, width: int = 128, classes: int = 20):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.out = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(tokens))
        return self.out(h[:, -1])


def image_models():
    tv = torchvision.models
    return {
        "resnet18": tv.resnet18(weights=None, num_classes=100),
        "mobilenet_v3_small": tv.mobilenet_v3_small(weights=None, num_classes=100),
        "squeezenet1_1": tv.squeezenet1_1(weights=None, num_classes=100),
        "vgg11": tv.vgg11(weights=None, num_classes=100),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
    ap.add_argument("--samples", type=int, default=64, help="samples per batch file")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    manifest = []

    def save(name, module, inputs, target, entry):
        path = os.path.join(args.out, name + ".pt")
        batch = os.path.join(args.out, name + ".batch.pt")
        scripted = torch.jit.script(module.train())
        tmp = path + ".tmp"
        scripted.save(tmp)
        os.replace(tmp, path)
        torch.save(inputs + [target], batch + ".tmp")
        os.replace(batch + ".tmp", batch)
        entry.update({"name": name, "model": path, "batch_file": batch,
                      "parameters": sum(p.numel() for p in module.parameters())})
        manifest.append(entry)
        print(f"exported {name}: {entry['parameters']:,} parameters -> {path}", file=sys.stderr)

    n = args.samples
    for name, m in image_models().items():
        size = IMAGE_SIZES.get(name, IMAGE)
        x = torch.randn(n, 3, size, size)
        y = torch.randint(0, 100, (n,))
        entry = {"inputs": [f"float32[B,3,{size},{size}]"], "target": "int64[B]:100",
                 "loss": "cross_entropy", "optimizer": "sgd", "family": "vision"}
        if name == "vgg11":
            # About 0.35 s per sample per trial on 2 cores: cap its searches at 24 samples.
            entry.update({"bench_target_batch": 24, "bench_small": 4, "bench_large": 12})
        save(name, m, [x], y, entry)

    vocab, context = 2048, 64
    tokens = torch.randint(0, vocab, (n, context))
    targets = torch.roll(tokens, -1, dims=1)
    # Mask a varying tail of every sequence (padding), so valid-token counts differ per sample.
    lengths = torch.randint(context // 2, context + 1, (n,))
    targets[torch.arange(context)[None, :] >= lengths[:, None]] = -100
    save("gpt_decoder", CausalLM(vocab, context), [tokens], targets,
         {"inputs": [f"int64[B,{context}]:{vocab}"], "target": f"int64[B,{context}]:{vocab}",
          "loss": "cross_entropy", "optimizer": "adamw", "family": "language"})

    seq = torch.randint(0, 5000, (n, 48))
    save("lstm_classifier", LSTMClassifier(), [seq], torch.randint(0, 20, (n,)),
         {"inputs": ["int64[B,48]:5000"], "target": "int64[B]:20", "loss": "cross_entropy",
          "optimizer": "adam", "family": "sequence"})

    with open(os.path.join(args.out, "manifest.json.tmp"), "w") as f:
        json.dump({"models": manifest, "torch": torch.__version__, "torchvision": torchvision.__version__}, f, indent=2)
    os.replace(os.path.join(args.out, "manifest.json.tmp"), os.path.join(args.out, "manifest.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
