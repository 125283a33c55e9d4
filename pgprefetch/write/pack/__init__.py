"""Language-model epochs: documents packed into fixed-length token sequences (``[packing]``).

An epoch of a packed config is planned from the documents' lengths alone, before a token is read:

- :mod:`.lengths`: each document's token count, on the epoch's snapshot (the server counts; no token is sent);
- :mod:`.packer`: the documents, in the epoch's shuffled order, laid into sequences (best-fit decreasing
  within groups, or the stream cut every ``length`` tokens), then the sequences shuffled;
- :mod:`.source`: the epoch planned (:mod:`.plan`: what a lone source and a mix share), its documents held or,
  beyond ``--memory``, on disk (:mod:`.spilled`); :mod:`.pieces`: a range of sequences' pieces, wherever they
  live; :mod:`.serving` and :mod:`.place`: each unit's documents fetched once and their pieces placed;
  :mod:`.parts`: a Ray cluster's part of the epoch;
- :mod:`.shares` and :mod:`.mixed`: sources mixed by tokens, each walking its passes in tokens, packed apart
  and interleaved as a fair queue.

The arrays a trainer's attention needs (``cu_seqlens``, labels, a loss mask) are derived by the readers
(:mod:`pgprefetch.read.packed`), not stored.
"""
