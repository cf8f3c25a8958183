"""`language`: a small decoder-only transformer LM on synthetic token streams. Compute-bound:
precision and compile matter."""

from __future__ import annotations

import math

import torch
from torch import nn

from torchpace.workload import Workload

VOCAB = 512
SEQ_LEN = 64
N_TOKENS = 131072


class TokenStream(torch.utils.data.Dataset):
    """Next-token windows over a stream drawn from a fixed sparse Markov chain (learnable, seeded)."""

    def __init__(self, n_tokens: int = N_TOKENS, seq_len: int = SEQ_LEN, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=gen)  # each token has 4 likely successors
        choice = torch.randint(0, 4, (n_tokens,), generator=gen)
        noise = torch.rand(n_tokens, generator=gen) < 0.1
        random_tokens = torch.randint(0, VOCAB, (n_tokens,), generator=gen)
        tokens = torch.empty(n_tokens, dtype=torch.long)
        tokens[0] = 0
        for i in range(1, n_tokens):
            tokens[i] = random_tokens[i] if noise[i] else successors[tokens[i - 1], choice[i]]
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int):
        start = index * self.seq_len
        window = self.tokens[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


class DecoderLM(nn.Module):
    """Token + position embeddings, pre-norm causal transformer blocks, tied output head."""

    def __init__(self, d_model: int = 256, n_heads: int = 4, n_layers: int = 4, seq_len: int = SEQ_LEN):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied head: keep initial logits near uniform
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) / math.sqrt(d_model))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:length]
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.norm(h) @ self.embed.weight.T


def _next_token_loss(logits: torch.Tensor, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), batch[1].reshape(-1))


def workload() -> Workload:
    torch.manual_seed(0)
    return Workload(
        model=DecoderLM(),
        dataset=TokenStream(),
        loss=_next_token_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01),
        batch_size=16,
        clip_grad_norm=1.0,
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 20)),
        name="language",
    )
