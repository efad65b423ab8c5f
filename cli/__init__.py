"""The top of edgemask: the ``edgemask`` command line (:mod:`edgemask.cli.main`) and ``edgemask demo``
(:mod:`edgemask.cli.demo`).

This is the only package that imports the stages (``trainer``, ``export``, ``devices``, ``profiling``); they import
the shared ground in :mod:`edgemask` and never this package (checked by ``tests/test_architecture.py``).
``python -m edgemask.cli`` is the same command as the ``edgemask`` console script.
"""
