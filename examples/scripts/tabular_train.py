"""The built-in `tabular` workload written as a plain training script: an MLP on in-memory features.

Nothing here knows torchpace: measure it with `torchpace bench -- python examples/scripts/tabular_train.py`,
tune it with `torchpace tune -- python ...`, run the tuned config with `torchpace launch --config
torchpace.toml -- python ...`. The model and data come from `torchpace.examples` so the script trains
exactly what the Workload `tabular` does; the loop is the usual one.
"""

import argparse

import torch
from torch import nn

from torchpace.examples.tabular import make_mlp, make_tabular_data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(make_tabular_data(), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = make_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for features, labels in loader:
            loss = nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
