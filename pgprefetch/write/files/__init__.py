"""The epoch's files: its arrays as zarr v3 shard files, their checksums, and the statistics of each field.

:mod:`.writer` turns collated batches into the epoch's folder (or S3 prefix), :mod:`.shardfiles` owns the
bytes of one shard file, and :mod:`.stats` the per-field statistics gathered on the way. Nothing here knows
how the batches were fetched or ordered: the pipeline above hands batches in, in any order.
"""
