"""``python -m pgprefetch``: the same as the ``pgprefetch`` command."""

from pgprefetch.cli import main

main()
