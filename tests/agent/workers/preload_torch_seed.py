"""A preloaded module that imports torch and seeds it: every worker keeps that seed."""

import torch

torch.manual_seed(7)
