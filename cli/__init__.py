"""The top of edgemask: the ``edgemask`` command line (:mod:`cli.main`) and ``edgemask demo`` (:mod:`cli.demo`).

This is the only package that imports the stages (``trainer``, ``export``, ``devices``, ``profiling``); they import
the shared ground in :mod:`edgemask` and never this package (checked by ``tests/test_architecture.py``).
``python -m cli`` is the same command as the ``edgemask`` console script.
"""
