"""Disaggregation tests share a contended CPU: one intra-op thread per process."""

import torch

torch.set_num_threads(1)
