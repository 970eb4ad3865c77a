"""The benchmarks (docs/testing.md, Benchmarks): run each from the repository's root as
``python -m bench.<name>``; ``make bench`` runs them all. Helpers: ``_common`` (servers,
clients, stub runner), ``_load`` (helper processes of ``throughput``), ``_stats``."""
