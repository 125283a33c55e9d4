"""Decoding: PostgreSQL's binary wire format straight into fixed-shape numpy batches, checked.

``wire`` and ``ragged`` view the binary arrays, ``casts`` judges what a dtype can hold, ``layout`` is the
plan (which columns make which field, and how an error names its sample), ``blobs`` decodes the batch
statement's results and ``collate`` casts them into the batch buffers. Imports ``pg`` (the columns and
the statement's result type) and ``config``; never the store, the dump or the reader.
"""

from pgprefetch.decode.collate import decode, fill
from pgprefetch.decode.layout import BatchLayout, FieldLayout, UnknownCategoryError

__all__ = ["BatchLayout", "FieldLayout", "UnknownCategoryError", "decode", "fill"]
