"""The benchmark ``make bench`` runs: blog post vs. COPY ceiling vs. ``pgprefetch dump``, as ratios."""
