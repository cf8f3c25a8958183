"""Fixture: an image-classification training script written the way the published reference scripts are
(torchvision's `references/classification/train.py`, timm's `train.py`): argparse with `-j/--workers`,
`-b/--batch-size`, `--epochs`, `--output-dir` (a checkpoint per epoch, none when it is ''), `--print-freq`,
`--train-crop-size`; the script passes its own loader settings (`num_workers=args.workers`,
`pin_memory=True`, and with `--persistent-workers` / `--prefetch-factor` those too) and its own
optimizer arguments (`--opt sgd|adamw`, `--foreach`/`--no-foreach`); it evaluates after each epoch and
prints progress as the references do. Its data is generated (a folder of images stands behind the
real ones): each sample is a uint8 image decoded from a seeded generator, randomly cropped, flipped
and normalized in the loader, the per-sample CPU work that loader workers overlap.

`--report FILE` writes the loader and optimizer settings the script ends up with, read from the objects.
"""

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class FakeImageFolder(Dataset):
    """`n` images of `size` x `size` in `classes` classes; `work` extra passes of per-sample filtering
    stand for JPEG decoding."""

    def __init__(self, n, size, crop, classes, work, train=True):
        self.n, self.size, self.crop, self.classes, self.work, self.train = n, size, crop, classes, work, train

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g).float() / 255
        for _ in range(self.work):  # "decoding"
            image = torch.nn.functional.avg_pool2d(image[None], 3, 1, 1)[0]
        if self.train:
            top, left = torch.randint(0, self.size - self.crop + 1, (2,), generator=g).tolist()
            image = image[:, top:top + self.crop, left:left + self.crop]
            if torch.rand((), generator=g) < 0.5:
                image = image.flip(-1)
        else:
            start = (self.size - self.crop) // 2
            image = image[:, start:start + self.crop, start:start + self.crop]
        mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
        return (image - mean) / std, index % self.classes


def small_resnet(classes):
    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    return nn.Sequential(block(3, 16, 2), block(16, 32, 2), block(32, 32, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, classes))


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training", add_help=True)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str, help="dataset path")
    parser.add_argument("-b", "--batch-size", default=16, type=int, help="images per gpu")
    parser.add_argument("--epochs", default=1000, type=int, metavar="N", help="number of total epochs to run")
    parser.add_argument("-j", "--workers", default=2, type=int, metavar="N", help="number of data loading workers")
    parser.add_argument("--persistent-workers", action="store_true", help="keep the loader's workers between epochs")
    parser.add_argument("--prefetch-factor", default=None, type=int, help="batches each worker loads ahead")
    parser.add_argument("--opt", default="sgd", type=str, help="optimizer")
    parser.add_argument("--foreach", dest="foreach", action="store_true", default=None, help="foreach optimizer kernels")
    parser.add_argument("--no-foreach", dest="foreach", action="store_false", help="the optimizer's per-parameter loop")
    parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate")
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", dest="weight_decay")
    parser.add_argument("--print-freq", default=10, type=int, help="print frequency")
    parser.add_argument("--output-dir", default=".", type=str, help="path to save outputs ('' saves nothing)")
    parser.add_argument("--train-crop-size", default=48, type=int, help="the random crop size used for training")
    parser.add_argument("--image-size", default=56, type=int, help="the size of the stored images")
    parser.add_argument("--samples", default=512, type=int, help="training images")
    parser.add_argument("--val-samples", default=32, type=int, help="validation images")
    parser.add_argument("--work", default=2, type=int, help="per-sample decoding passes")
    parser.add_argument("--report", default=None, type=str, help="write the loader/optimizer settings here")
    return parser


def train_one_epoch(model, criterion, optimizer, data_loader, epoch, print_freq):
    model.train()
    start = time.time()
    for i, (image, target) in enumerate(data_loader):
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_freq == 0:
            print(f"Epoch: [{epoch}]  [{i}/{len(data_loader)}]  loss: {loss.item():.4f}  "
                  f"lr: {optimizer.param_groups[0]['lr']:.4f}  time: {time.time() - start:.2f}", flush=True)


def evaluate(model, criterion, data_loader):
    model.eval()
    correct = total = 0
    with torch.inference_mode():
        for image, target in data_loader:
            output = model(image)
            correct += (output.argmax(1) == target).sum().item()
            total += target.numel()
    print(f"Test:  Acc@1 {100.0 * correct / max(1, total):.3f}", flush=True)


def main(args):
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    classes = 10
    dataset = FakeImageFolder(args.samples, args.image_size, args.train_crop_size, classes, args.work)
    dataset_test = FakeImageFolder(args.val_samples, args.image_size, args.train_crop_size, classes, 0, train=False)
    loader_options = {}
    if args.persistent_workers:
        loader_options["persistent_workers"] = True
    if args.prefetch_factor is not None:
        loader_options["prefetch_factor"] = args.prefetch_factor
    data_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                             pin_memory=True, drop_last=True, **loader_options)
    data_loader_test = DataLoader(dataset_test, batch_size=args.batch_size, num_workers=args.workers, pin_memory=True)
    model = small_resnet(classes)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    if args.opt == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.weight_decay, foreach=args.foreach)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, foreach=args.foreach)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"num_workers": data_loader.num_workers, "prefetch_factor": data_loader.prefetch_factor,
                       "persistent_workers": data_loader.persistent_workers, "pin_memory": data_loader.pin_memory,
                       "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused")}, f)
    print("Start training", flush=True)
    start_time = time.time()
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, epoch, args.print_freq)
        lr_scheduler.step()
        evaluate(model, criterion, data_loader_test)
        if args.output_dir:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, "checkpoint.pth"))
    print(f"Training time {time.time() - start_time:.1f} s", flush=True)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
