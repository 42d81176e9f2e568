"""A preloaded module that seeds ``random`` on import: every worker keeps that seed."""

import random

random.seed(1234)
