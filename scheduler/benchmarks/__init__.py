"""`manage.py bench`: end-to-end benchmarks of real processes (web, worker, upstream, load
generator) on a database of their own. See docs/performance.md."""
