"""The built-in `gpt` workload written as a plain training script, the way nanoGPT trains: a GPT-2-class
decoder on a generated token stream, AdamW (betas 0.9/0.95, weight decay 0.1), gradients clipped at 1.0.

Nothing here knows torchpace: `torchpace bench -- python examples/scripts/gpt_train.py`. The model and
data come from `torchpace.examples.gpt`, so it trains what the Workload does. `--size` picks 4 layers
of 256 with 256 tokens of context (small) or GPT-2 small, 124M parameters with 1,024 (full); without
it, full where CUDA is available, else small.
"""

import argparse

import torch

from torchpace.examples.gpt import GPT_SIZES, SIZES, build_model, make_optimizer, next_token_loss, size_for, token_stream


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default=size_for(torch.cuda.is_available()),
                        help="small: 4 layers x 256, 256 tokens; full: GPT-2 124M, 1024 tokens "
                             "(default: full on a GPU, else small)")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: 4 small, 16 full)")
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    batch_size = args.batch_size or GPT_SIZES[args.size].batch_size
    loader = torch.utils.data.DataLoader(token_stream(args.size), batch_size=batch_size, shuffle=True, drop_last=True,
                                         pin_memory=device.type == "cuda")
    model = build_model(args.size).to(device)
    optimizer = make_optimizer(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        for tokens, targets in loader:
            tokens = tokens.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss = next_token_loss(model(tokens), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % args.log_interval == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
            if args.max_steps is not None and step >= args.max_steps:
                return


if __name__ == "__main__":
    main()
