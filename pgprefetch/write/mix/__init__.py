"""Mixed epochs: several sources in one epoch, in exact proportion in every batch prefix.

A mixed epoch is planned, like any epoch, before a byte is written, and is then an ordinary epoch (plus a
``source`` array) that every reader reads unchanged. The plan has three parts, bottom up:

- :mod:`.apportion`: how many samples each source gives each batch (the quota method: exact in every
  prefix of batches, whatever the weights);
- :mod:`.passes`: which samples those are: each source walks its own passes, each pass an order given by a
  keyed hash of the keys, so a position is a place in the hash order that survives rows added or deleted;
- :mod:`.positions`: where each source stands when an epoch begins, from the store's records of earlier
  epochs (weights edited between epochs continue each source where it was) or, without them, by counting;
- :mod:`.source`: the epoch's batch source, each source read by its own mode's machinery;
- :mod:`.serving`: each unit filled from the sources' runs; :mod:`.parts`: a cluster's part of the epoch.
"""
