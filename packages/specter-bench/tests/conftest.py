"""Session settings for specter-bench's tests."""

import matplotlib
import torch

# Tiny models and tensors: intra-op threads only add synchronisation on a small shared machine.
torch.set_num_threads(1)
# Plots are built without pyplot; this keeps any indirect pyplot import headless too.
matplotlib.use("Agg")
