"""`gpt`: a GPT-2-class decoder trained as nanoGPT trains it, on a generated token stream.

The model is nanoGPT's GPT: learned token and position embeddings, pre-LayerNorm blocks of causal
self-attention (through `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`) and a
4x GELU MLP, a final LayerNorm and an lm_head tied to the token embedding. At full size it is GPT-2
small (12 layers, 12 heads, 768 wide, 1,024 tokens of context, vocabulary padded to 50,304: 124,475,904
parameters), trained on 16 x 1,024 tokens per step, the micro-batch of the public GPT-2 reproduction.
The defaults are nanoGPT's as a user starts from them: fp32, eager, AdamW(lr=6e-4, betas=(0.9, 0.95),
weight_decay=0.1 on the matrices only; torch's default implementation, not fused), gradients clipped
at 1.0, batches pinned where CUDA is present.

The tokens are generated in memory (`TokenStream`): phrases of a fixed phrasebook, drawn at random and
sometimes corrupted, so a model that reads its context predicts most tokens and the loss falls.

| size | layers x width (heads) | context | vocabulary | parameters | batch |
|---|---|---|---|---|---|
| `small` | 4 x 256 (4) | 256 | 8,192 | 5,322,240 | 4 x 256 tokens |
| `full` | 12 x 768 (12) | 1,024 | 50,304 | 124,475,904 | 16 x 1,024 tokens |

`gpt` picks the size by the device (`size_for`): full where CUDA is available, else small;
`gpt-small` and `gpt-full` name one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from torchpace.examples.sizes import FULL, SIZES, SMALL, size_for
from torchpace.workload import Workload

@dataclass(frozen=True)
class GPTConfig:
    """nanoGPT's GPTConfig, plus what a size of the workload trains on."""

    size: str
    label: str  # the model, in words
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # tokens of context
    vocab_size: int
    batch_size: int  # sequences per step
    n_tokens: int  # tokens in the generated stream (an epoch)

    @property
    def name(self) -> str:
        return f"gpt ({self.label}, {self.n_layer}x{self.n_embd}, {self.block_size} tokens, {self.size})"


GPT_SIZES = {
    # 4 x 256 tokens: a step as long as resnet-small's (fp32, one thread, beside two busy processes: 1.0 s
    # against 1.4 s; 8 x 256 took 1.9 s), well under a second on 2 free cores: a 15-minute tune decides its knobs
    SMALL: GPTConfig(SMALL, "GPT 5M", n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=8192,
                     batch_size=4, n_tokens=2**20),
    # GPT-2 small; the vocabulary padded from 50,257 to a multiple of 64, as nanoGPT pads it
    FULL: GPTConfig(FULL, "GPT-2 124M", n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304,
                    batch_size=16, n_tokens=2**22),
}


# ---- the data -----------------------------------------------------------------------------------


class TokenStream(torch.utils.data.Dataset):
    """`(tokens, next tokens)` windows of `block_size` over a generated stream (seeded, in memory).

    The stream is phrases of `phrase_len` tokens drawn uniformly from a fixed phrasebook of `phrases`,
    with `noise` of the tokens replaced by random ones: the first token of a phrase is a guess, the rest
    follow from the context. A phrasebook small enough to be seen often makes the loss fall from the first
    steps (the small model, AdamW 6e-4, 4 x 256 tokens a step: from 9.1 to 5.4 in 60 steps; with 4,096
    phrases it stayed at 9.0), as a guard comparing a few steps of two configs needs.
    """

    def __init__(self, vocab_size: int, block_size: int, n_tokens: int, phrases: int = 256, phrase_len: int = 16,
                 noise: float = 0.05, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        book = torch.randint(0, vocab_size, (phrases, phrase_len), generator=gen)
        drawn = torch.randint(0, phrases, (-(-n_tokens // phrase_len),), generator=gen)
        tokens = book[drawn].reshape(-1)[:n_tokens]
        corrupt = torch.rand(n_tokens, generator=gen) < noise
        tokens[corrupt] = torch.randint(0, vocab_size, (int(corrupt.sum()),), generator=gen)
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        window = self.tokens[start:start + self.block_size + 1]
        return window[:-1], window[1:]


def token_stream(size: str) -> TokenStream:
    """The token stream of `size`."""
    config = GPT_SIZES[size]
    return TokenStream(config.vocab_size, config.block_size, config.n_tokens)


# ---- the model: nanoGPT's, with the same module names ------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.size()
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: returns the logits of every position, `(batch, length, vocab_size)`. Weights start
    normal(0, 0.02), the residual projections at 0.02 / sqrt(2 * n_layer), as GPT-2's."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied: one matrix embeds and predicts
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.size(1)
        if length > self.config.block_size:
            raise ValueError(f"a sequence of {length} tokens is longer than the context ({self.config.block_size})")
        positions = torch.arange(length, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build_model(size: str) -> GPT:
    """The model of `size`, seeded: the same every call."""
    torch.manual_seed(0)
    return GPT(GPT_SIZES[size])


def make_optimizer(params, lr: float = 6e-4) -> torch.optim.AdamW:
    """nanoGPT's AdamW: betas (0.9, 0.95), weight decay 0.1 on matrices and embeddings, none on biases
    and norms; torch's default implementation (neither fused nor asked for foreach)."""
    params = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every position's logits against its next token (in fp32 under autocast)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def _loss(logits: torch.Tensor, batch) -> torch.Tensor:
    return next_token_loss(logits, batch[1])


# ---- the workloads ------------------------------------------------------------------------------


def build_workload(size: str) -> Workload:
    """The `gpt` Workload at `size` (`small` or `full`)."""
    if size not in GPT_SIZES:
        raise ValueError(f"gpt size {size!r} is not one of {', '.join(SIZES)}")
    config = GPT_SIZES[size]
    return Workload(
        model=build_model(size),
        dataset=token_stream(size),
        loss=_loss,
        optimizer=make_optimizer,
        batch_size=config.batch_size,
        clip_grad_norm=1.0,
        loader_options={"pin_memory": torch.cuda.is_available()},  # in-memory tokens: no workers, as nanoGPT
        name=config.name,
    )


def workload() -> Workload:
    """`gpt`: full size where CUDA is available, else small."""
    return build_workload(size_for(torch.cuda.is_available()))


def small() -> Workload:
    """`gpt-small`: 4 layers, 256 wide, 256 tokens of context."""
    return build_workload(SMALL)


def full() -> Workload:
    """`gpt-full`: GPT-2 small, 124M parameters, 1,024 tokens of context."""
    return build_workload(FULL)
