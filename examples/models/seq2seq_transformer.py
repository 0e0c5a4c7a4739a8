import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """A translation model: token and position embeddings, nn.Transformer, a causal target mask and
    the source's padding masked in the decoder's attention over the memory."""

    def __init__(self, vocab=60, d=32, heads=4, max_len=32):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, d)
        self.tgt_emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.transformer = nn.Transformer(d, heads, 2, 2, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)
        self.scale = math.sqrt(d)

    def embed(self, table, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return table(tokens) * self.scale + self.pos(positions)

    def forward(self, src, tgt, src_pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).triu(1)
        h = self.transformer(
            self.embed(self.src_emb, src),
            self.embed(self.tgt_emb, tgt),
            tgt_mask=causal,
            memory_key_padding_mask=src_pad,
        )
        return self.out(h)


def get_inputs():
    src_pad = torch.zeros(2, 9, dtype=torch.bool)
    src_pad[1, 6:] = True
    return [torch.randint(0, 60, (2, 9)), torch.randint(0, 60, (2, 7)), src_pad]


def get_init_inputs():
    return []
