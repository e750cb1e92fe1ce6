"""``python -m kvtier`` is the ``kvtier`` command."""

from kvtier.cli import console

console()
