"""The soak: the real loop, cron dumping ahead while training reads, for minutes, with faults; nothing lost.

Each part is tested on its own elsewhere (dumps through killed connections, ``--ahead/--keep``, the stream,
the S3 lease). The soak runs them together as users deploy them, which is where the seams are: ``bed``
(the server, proxies and store), ``deploy`` (the command lines, read from deploy/), ``cron`` and ``training``
(the processes), ``schedule`` (the faults), ``watch`` (the store seen from outside), ``check`` (what must
hold), ``report`` and ``picture``; ``run`` ties them together and ``python -m tests.soak`` is ``make soak``.
"""
