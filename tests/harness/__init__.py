"""The tests' harness: the set-up several test files share, in one place (tests import it, never each other).

Which module holds what:

- ``db``: PostgreSQL: ``execute`` and ``fetch`` run synchronously, ``with_database``, ``own_database`` (a
  database of a module's own), ``own_server`` (a server of its own: the suite's, the bench's, or one a test
  restarts) and ``data_folder`` (an embedded server's, from its DSN), the ``s`` table of the ``s_table``
  fixture (``S_TABLE``, ``S_ROWS``), the scan tables of the ``ticks`` fixture (``TICKS_TABLES``)
- ``configs``: config files: ``write_config``, ``s_config`` (table ``s``), ``operations_config``,
  ``v_config`` (one float field over any table), ``scan_config`` (scan mode), ``SEQUENCES`` (the demo's)
- ``loading``: the config loader's own tests: ``VALID`` (data), ``changed`` one key (or ``DELETE``), ``write``,
  ``load``, ``error`` (the one-line message of a refused file)
- ``dumps``: dumps in this process (``dump``, ``read_arrays``, ``chunk_bytes``; the CLI's ``run_cli``) and as
  processes of their own (``dump_argv``, ``start_dump``, ``journal_lines``, ``wait_for``, ``kill_9_mid_dump``,
  ``kill_9_after``, ``dump_on_a_full_disk`` and its ``RESUME_HINT``)
- ``epochs``: small epochs for the readers: ``s(id, v = id)`` (``counting_table``, ``counting_store``,
  the module fixture ``counting_store_fixture``), the demo's ``sequences_store``, and stores made odd on
  purpose (``swap_shard_chunks``, ``claim_format_version``, ``assert_a_partial_epoch_is_not_read``)
- ``ragged``: variable-length data: the ``seqs`` and ``events`` tables (``seqs_table``, the ``seqs`` fixture),
  ``seqs_config``, ``by_key`` (each stored sample by its key), ``database`` (what the database holds)
- ``golden``: the golden epochs' table, configs and pinned digests (``GOLDEN``, ``digest``, ``golden_config``)
- ``spill``: keys beyond ``[source] memory``: ``TINY_MEMORY``, ``numbers_config``, ``load_tables``
- ``faults``: killed connections, a restarted server, a freezable TCP route (the long scenarios are
  marked ``chaos``: ``make chaos`` runs them, ``make test`` leaves them out)
- ``s3``: moto's S3 server, in this process (``s3_server``) or its own (``moto_process``), a throttling
  proxy, ``environment`` (AWS variables set, then restored), ``epoch_objects`` (an epoch's objects, named as
  ``chunk_bytes`` names a local epoch's files)
- ``raycluster``: the two-node Ray cluster, its parts' processes and journals, ``fault_mid_dump`` (a
  fault struck mid-dump), ``single_process`` (the bytes to equal)
- ``hostile``: the epoch the hostile-store tests copy and tamper with: ``r(id, v, score)`` (``R_TABLE``, ``N``,
  ``SIZE``; the module fixtures ``hostile_db`` and ``hostile_store``), ``r_config``, ``pristine_store``
- ``servers``: ``pgprefetch server`` as a process, and what is left of its PostgreSQL (``cleanup``)
- ``properties``: the Hypothesis profiles (``ci`` by default: derandomized, a fixed size; ``dev`` by
  ``HYPOTHESIS_PROFILE=dev``) and the strategies the property tests share (``key_arrays``, seeds, epochs, JSON)
- ``scripts/``: the scripts tests run as processes by path (JAX, Grain, accelerate)

tests/conftest.py holds only the fixtures (thin, over these); tests/test_harness_rules.py keeps test
modules from importing each other or conftest. ``bench`` uses ``db`` and ``s3`` too (the same servers).
"""
