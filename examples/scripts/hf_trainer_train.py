"""A Hugging Face `Trainer` script: a tiny GPT-2 built from a config (no download) trained as a causal
language model on random token sequences.

Nothing here knows torchpace: measure it with `torchpace bench -- python examples/scripts/hf_trainer_train.py`,
tune it with `torchpace tune -- python ...`, profile it with `torchpace profile -- python ...`, run the
tuned config with `torchpace launch --config torchpace.toml -- python ...`. Nothing is fetched from the
Hub (`HF_HUB_OFFLINE=1` is set before transformers loads). The Trainer's own clock is its
`train_steps_per_second`, printed when training ends; with `--stamps FILE` a `TrainerCallback` writes
one timestamp per optimizer step, so the figures torchpace reports can be checked against the script's own.
"""

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token sequences; the labels are the inputs (the model shifts them)."""

    def __init__(self, count, length, vocab):
        self.tokens = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class StepClock(TrainerCallback):
    """One timestamp per optimizer step (`on_step_end`), and the DataLoader/optimizer the Trainer built."""

    def __init__(self, stamps_path=None, report_path=None):
        rank = os.environ.get("RANK")  # under torchrun or accelerate launch: one file per rank, STAMPS.rankR
        suffix = f".rank{rank}" if rank is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        self.stamps = open(f"{stamps_path}{suffix}", "a", buffering=1) if stamps_path else None
        self.report_path = report_path

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        if self.report_path:
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
            base = getattr(train_dataloader, "base_dataloader", train_dataloader)
            with open(self.report_path, "w") as f:
                json.dump({"num_workers": base.num_workers, "pin_memory": base.pin_memory,
                           "persistent_workers": base.persistent_workers, "prefetch_factor": base.prefetch_factor,
                           "optimizer": type(inner).__name__, "foreach": inner.defaults.get("foreach"),
                           "fused": inner.defaults.get("fused"), "threads": torch.get_num_threads()}, f)

    def on_step_end(self, args, state, control, **kwargs):
        if self.stamps:
            self.stamps.write(f"{time.perf_counter()}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--stamps", default=None, help="append one timestamp per optimizer step to this file")
    parser.add_argument("--report", default=None, help="write the DataLoader and optimizer settings used to this JSON file")
    args = parser.parse_args()

    config = GPT2Config(vocab_size=1024, n_positions=args.seq_len, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config)
    data = RandomTokens(4096, args.seq_len, config.vocab_size)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, per_device_train_batch_size=args.batch_size,
                                     gradient_accumulation_steps=args.grad_accum, max_steps=args.max_steps,
                                     learning_rate=3e-4, logging_steps=50, save_strategy="no", report_to="none",
                                     use_cpu=True, seed=0)
        trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[StepClock(args.stamps, args.report)])
        metrics = trainer.train().metrics
    print(f"train_steps_per_second {metrics['train_steps_per_second']} "
          f"train_samples_per_second {metrics['train_samples_per_second']} (Trainer clock)", flush=True)


if __name__ == "__main__":
    main()
