"""The built-in `language` workload written as a plain training script: a small decoder LM on
synthetic token streams, with warm-up LR scheduling and gradient clipping.

Nothing here knows torchpace: `torchpace bench -- python examples/scripts/language_train.py`.
The model and data come from `torchpace.examples.language`, so it trains what the Workload does.
"""

import argparse

import torch
from torch import nn

from torchpace.examples.language import VOCAB, DecoderLM, TokenStream


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(TokenStream(), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = DecoderLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    for epoch in range(args.epochs):
        for tokens, targets in loader:
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
