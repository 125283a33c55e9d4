"""The command line: ``pgprefetch`` and its commands, a few lines each over one library call.

``commands`` defines them (``pgprefetch.cli:main`` is the console script; ``dump``, the longest, has a
module of its own, ``options`` the options several share), ``console`` translates every
error into one line and an exit code in one place, ``words`` parses and prints what users type and read,
``progress`` draws the dump's progress. The top floor: it may import everything below it.
"""

from pgprefetch.cli.commands import cli, main

__all__ = ["cli", "main"]
