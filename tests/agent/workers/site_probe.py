"""Prints what a worker sees of its Python path, and whether a user's sitecustomize ran."""

import os
import sys

print(f"sitecustomize {getattr(sys.modules.get('sitecustomize'), 'MARK', None)}", flush=True)
print(f"pythonpath {os.environ.get('PYTHONPATH')}", flush=True)
print(f"worker_site_on_path {any(p.endswith('_worker_site') for p in sys.path)}", flush=True)
