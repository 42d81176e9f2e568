"""A worker without ``@record`` whose rank 1 raises. Its traceback is recorded only when the
script runs through ``--run-path`` (as under torchrun):

    TORCHELASTIC_ERROR_FILE=/tmp/why.json aioelastic run --standalone --nproc-per-node 2 \\
        --run-path examples/agent_run_path.py; cat /tmp/why.json
"""

import os


def load_batch() -> None:
    raise RuntimeError(f"no batch for rank {os.environ['RANK']}")


if os.environ["RANK"] == "1":
    load_batch()
