"""Fixture (f): imports torch and works, but never calls backward() or an optimizer's step()."""

import time

import torch

x = torch.randn(64, 64)
while True:
    x = torch.tanh(x @ x.T / 64)
    time.sleep(0.01)
