"""The all-in-one `hacfed` tool: demo, sim, bench, report, models and the GPU check.

It starts both sides of a federation in one process or on one machine, so it is the one package that
imports `hacfed.server` and `hacfed.clients`; the shared library below it (`hacfed/`) imports neither.
"""
