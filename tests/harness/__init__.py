"""The tests' harness: the set-up several test files share, in one place (tests import it, never each other).

Which module holds what:

- ``db``: PostgreSQL: ``execute``/``fetch`` run synchronously, ``with_database``, ``own_database`` (a
  database of a module's own), ``own_server`` (a server of its own, to restart), the ``s`` table (``S_TABLE``)
- ``configs``: config files: ``write_config``, ``s_config`` (table ``s``), ``operations_config``,
  ``scan_config`` (scan mode), ``SEQUENCES`` (the demo's windows)
- ``dumps``: dumps in process (``dump``, ``read_arrays``, ``chunk_bytes``) and as processes (``dump_argv``,
  ``start_dump``, ``journal_lines``, ``wait_for``)
- ``epochs``: small epochs for the readers: ``s(id, v = id)`` (``counting_table``, ``counting_store``, the
  module fixture ``counting_store_fixture``)
- ``golden``: the golden epochs' table, configs and pinned digests (``GOLDEN``, ``digest``)
- ``spill``: keys beyond ``[source] memory``: ``TINY_MEMORY``, ``numbers_config``, ``load_tables``
- ``faults``: killed connections, a restarted server, a freezable TCP route
- ``s3``: moto's S3 server (in this process or its own), a throttling proxy
- ``raycluster``: the two-node Ray cluster, its parts' processes and journals, ``fault_mid_dump``
- ``servers``: ``pgprefetch server`` as a process and what is left of its PostgreSQL
- ``scripts/``: the scripts tests run as processes by path (JAX, Grain, accelerate)

tests/conftest.py holds only the fixtures (thin, over these); tests/test_harness_rules.py keeps test
modules from importing each other or conftest.
"""
