"""Language-model epochs: documents packed into fixed-length token sequences (``[packing]``).

An epoch of a packed config is planned from the documents' lengths alone, before a token is read:

- :mod:`.lengths`: each document's token count, on the epoch's snapshot (the server counts; no token is sent);
- :mod:`.packer`: the documents, in the epoch's shuffled order, laid into sequences (best-fit decreasing
  within groups, or the stream cut every ``length`` tokens), then the sequences shuffled;
- :mod:`.source`: the batch source that fetches each unit's documents once and places their pieces.

The arrays a trainer's attention needs (``cu_seqlens``, labels, a loss mask) are derived by the readers
(:mod:`pgprefetch.read.packed`), not stored.
"""
