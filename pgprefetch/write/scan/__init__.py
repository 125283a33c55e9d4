"""Scan mode: the table read once per epoch (or per run) with binary COPY on the snapshot, cut on the client.

``shape`` describes the relation and builds its COPY, ``copystream`` decodes the stream, ``table`` reads,
sorts, cuts and gathers, and ``mode`` makes the batch sources the dump writes. A table larger than memory:
``partition`` splits its one read into passes on disk, ``keyspill`` orders keys beyond memory, ``passes``
spools a pass's samples by batch group, ``multipass`` makes the batch source of those passes.
"""
