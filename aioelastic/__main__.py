"""``python -m aioelastic``: the same as the ``aioelastic`` command."""

from aioelastic.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
