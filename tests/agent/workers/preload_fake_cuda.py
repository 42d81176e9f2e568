"""A module that must not be preloaded: it stands for one that initialises CUDA on import.

No GPU here, so it installs a ``torch`` whose ``torch.cuda.is_initialized()`` says True, which
is what the template checks before each fork.
"""

import sys
import types

fake = types.ModuleType("torch")
fake.cuda = types.SimpleNamespace(is_initialized=lambda: True)  # type: ignore[attr-defined]
sys.modules["torch"] = fake
