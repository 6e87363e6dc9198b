"""The benchmarks behind every figure of ``docs/PERFORMANCE.md``, one script per claim.

Run one as ``python benchmarks/<name>.py [--quick] --json OUT.json`` (or ``python -m
benchmarks.<name>``); ``make bench-list`` lists them all with their commands, ``make bench``
runs them. Shared code lives in the ``_``-prefixed modules, imported as ``benchmarks._x``:
``_harness`` (the command line, the JSON envelope, the outputs), ``_fresh_process`` (a
measurement in a process of its own), ``_registry`` (the list), ``_embedding_cases``,
``_selection``, ``_peers``, ``_scale_out_worker``. A script run by path puts the repository
root in place of its own directory on ``sys.path`` first (two lines at its top), so the
package imports and scripts never import each other.
"""
