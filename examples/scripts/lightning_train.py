"""A PyTorch Lightning training script: a small MLP classifier on random features, trained by
`Trainer.fit` (automatic optimization: AdamW steps with Lightning's closure around the forward and
backward).

Nothing here knows torchpace: measure it with `torchpace bench -- python examples/scripts/lightning_train.py`,
tune it with `torchpace tune -- python ...`, profile it with `torchpace profile -- python ...`, run the
tuned config with `torchpace launch --config torchpace.toml -- python ...`. The data are generated,
nothing is downloaded. `StepClock`, a Lightning callback, is the framework's own clock: it prints the
steps/s of each epoch (from its second step) and, with `--stamps FILE`, writes one timestamp per
optimizer step, so the figures torchpace reports can be checked against the script's own.
With `--devices 2 --strategy ddp` Lightning starts the ranks itself (the script runs once per rank, each
rank's stamps in STAMPS.rankR): `torchpace bench -- python ...` measures every rank as one job.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone `pytorch-lightning` package
    import pytorch_lightning as pl


class Classifier(pl.LightningModule):
    def __init__(self, features=64, hidden=256, classes=10, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.LayerNorm(hidden),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class StepClock(pl.Callback):
    """The framework's clock: a timestamp after every optimizer step (Lightning's `on_train_batch_end`
    runs once per optimizer step without gradient accumulation)."""

    def __init__(self, stamps_path=None, report_path=None):
        self.stamps_path, self.stamps = stamps_path, None
        self.report_path = report_path
        self.epoch_stamps = []

    def setup(self, trainer, module, stage):
        if self.stamps_path and self.stamps is None:  # one file per rank when Lightning runs several
            suffix = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
            self.stamps = open(f"{self.stamps_path}{suffix}", "a", buffering=1)

    def on_train_start(self, trainer, module):
        if self.report_path and trainer.global_rank == 0:  # what the framework ended up with, read from its own objects
            loader = trainer.train_dataloader
            optimizer = trainer.optimizers[0]
            with open(self.report_path, "w") as f:
                json.dump({"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                           "persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor,
                           "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused"),
                           "threads": torch.get_num_threads()}, f)

    def on_train_epoch_start(self, trainer, module):
        self.epoch_stamps = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        now = time.perf_counter()
        self.epoch_stamps.append(now)
        if self.stamps:
            self.stamps.write(f"{now}\n")

    def on_train_epoch_end(self, trainer, module):
        if len(self.epoch_stamps) > 2:
            rate = (len(self.epoch_stamps) - 1) / (self.epoch_stamps[-1] - self.epoch_stamps[0])
            print(f"epoch {trainer.current_epoch}: {rate:.2f} steps/s (Lightning callback clock)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--stamps", default=None, help="append one timestamp per optimizer step to this file")
    parser.add_argument("--report", default=None, help="write the DataLoader and optimizer settings used to this JSON file")
    parser.add_argument("--devices", type=int, default=1, help="processes Lightning starts (its own launcher re-runs "
                                                                "this script once per extra rank)")
    parser.add_argument("--strategy", default="auto", help="Lightning's strategy (ddp with --devices 2 or more)")
    args = parser.parse_args()

    pl.seed_everything(0)
    features = torch.randn(args.samples, 64)
    labels = (features[:, :10].argmax(dim=1) + (features[:, 10] > 1).long()) % 10
    loader = DataLoader(TensorDataset(features, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=args.strategy, max_epochs=args.epochs, logger=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[StepClock(args.stamps, args.report)])
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
