"""Fixture (e): the DataLoader's dataset raises inside its worker processes."""

import torch
from torch.utils.data import DataLoader, Dataset


class Broken(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        raise ValueError(f"sample {i} is corrupt (raised by the script's own dataset)")


model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Broken(), batch_size=8, num_workers=2):
    model(x).sum().backward()
    optimizer.step()
