"""Scan mode: the table read once per epoch (or per run) with binary COPY on the snapshot, cut on the client.

``shape`` describes the relation and builds its COPY, ``copystream`` decodes the stream, ``table`` reads,
sorts, cuts and gathers, ``passes`` reads a table larger than memory in key ranges, and ``mode`` makes
the batch sources the dump writes.
"""
