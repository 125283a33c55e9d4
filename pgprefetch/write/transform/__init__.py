"""``[transforms]``: Python run on each sample's input columns before the write, once for every epoch.

``loading`` (the callables and the fingerprint of what decides their outputs), ``inputs`` (the input
columns checked, the statement that sends them, every sample key for a sweep), ``outputs`` (a return value
checked against its fields and packed), ``runner`` (in the dump's process or worker processes; ``ctx``),
``cache`` (deterministic outputs by content, in one SQLite file), ``stage`` (the batch source that adds the
outputs to each unit; the sweep of ``on_error = "skip"``), ``mixed`` (a stage per source of a mixed epoch),
``rerun`` (one sample, for ``pgprefetch transform``), ``ready`` (the tokenizers users write first).
"""
