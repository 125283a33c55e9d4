"""``python -m pgprefetch``: the same as the ``pgprefetch`` command."""

from .cli import main

main()
