"""The built-in `vision` workload written as a plain training script: a small ResNet on a folder of
JPEG files (written once to torchpace's cache), decoded and augmented in the DataLoader.

Nothing here knows torchpace: `torchpace bench -- python examples/scripts/vision_train.py`. Its
loader decodes in the training process (num_workers=0): the case `data.num_workers` is tuned for.
"""

import argparse

import torch
from torch import nn

from torchpace.examples.vision import SmallResNet, image_dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(image_dataset(train=True), batch_size=args.batch_size, shuffle=True,
                                         drop_last=True, num_workers=0)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
