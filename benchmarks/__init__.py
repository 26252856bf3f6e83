"""fastqa benchmark suite: every op case against the naive, eager and compiled references.

``python -m benchmarks [--quick] [--ops ...] [--cases ...] [--out DIR]`` (``make bench``) times each
registered case, interleaving its implementations, and writes ``results.json`` and ``speedup.png``.
``python -m benchmarks.compare OLD.json NEW.json`` flags regressions.

Layout: ``registry`` (the pluggable case registry), ``cases`` (the op cases), ``cases_qanet`` /
``cases_convs2s`` / ``cases_readers`` (the model cases), ``measure`` (timing,
peak memory, machine peaks), ``runner`` (runs cases into records), ``report`` (table, JSON, chart).
Imports go one way: a case module imports ``registry``; this package imports the case modules, so
importing ``benchmarks`` (or any module of it) registers every case.
"""
from . import cases  # noqa: F401,E402  (registers the op cases)
from . import cases_convs2s, cases_qanet, cases_readers  # noqa: F401,E402  (registers the model cases)
