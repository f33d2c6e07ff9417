"""Session settings for specter-spec's tests."""

import torch

# The models under test are tiny: intra-op threads only add synchronisation, and
# on a small shared machine they make each forward tens of times slower.
torch.set_num_threads(1)
