"""What a dump writes outside its epoch: one folder, one file layer, one format.

- :mod:`.folder`: :class:`~.folder.SpillFolder`, the one owner of a dump's temporary files: ``--scratch``
  (``[source] scratch``) or one folder beside the partial epoch; private, made afresh, removed when the dump
  ends, and a killed dump's leftovers removed by the next dump of the epoch.
- :mod:`.columns`: :class:`~.columns.ColumnFile`, the one spill format: rows of named columns appended a
  block at a time, read back by any range of rows. Keys are a column file of int64 slots.
"""
