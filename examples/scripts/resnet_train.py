"""The built-in `resnet` workload written as a plain training script, the way the PyTorch ImageNet
example trains: a ResNet on a folder of JPEG files (written once to torchpace's cache), decoded and
augmented (random resized crop, flip, normalise) in 4 DataLoader workers, SGD with momentum.

Nothing here knows torchpace: `torchpace bench -- python examples/scripts/resnet_train.py`. The model
and data come from `torchpace.examples.resnet`, so it trains what the Workload does. `--size` picks
ResNet-18 on 96 px crops (small) or ResNet-50 on 224 px crops (full); without it, full where CUDA is
available, else small.
"""

import argparse

import torch
from torch import nn

from torchpace.examples.resnet import (RESNET_SIZES, SIZES, build_model, image_dataset, make_optimizer, scaled_lr,
                                      size_for)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default=size_for(torch.cuda.is_available()),
                        help="small: ResNet-18, 96 px; full: ResNet-50, 224 px (default: full on a GPU, else small)")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=None, help="default: 32 small, 256 full")
    parser.add_argument("-j", "--workers", type=int, default=4, help="DataLoader worker processes")
    parser.add_argument("--lr", type=float, default=None, help="default: 0.1 per 256 samples of the batch")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--print-freq", type=int, default=10)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    batch_size = args.batch_size or RESNET_SIZES[args.size].batch_size
    loader = torch.utils.data.DataLoader(image_dataset(args.size), batch_size=batch_size, shuffle=True,
                                         num_workers=args.workers, pin_memory=device.type == "cuda", drop_last=True)
    model = build_model(args.size).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = make_optimizer(model.parameters(), lr=args.lr or scaled_lr(batch_size))

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.print_freq == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
            if args.max_steps is not None and step >= args.max_steps:
                return


if __name__ == "__main__":
    main()
