"""Engine tests run on a shared CPU: one intra-op thread avoids OpenMP threads spinning against
each other when the cores are oversubscribed (tens of times slower), and costs little here."""

import torch

torch.set_num_threads(1)
