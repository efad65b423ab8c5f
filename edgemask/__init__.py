"""edgemask: train personalized sparse models federatedly, compact them, profile them on edge boards.

This package is the ground every stage stands on, and imports none of them: errors, registries, atomic file
writes and locks, the artifact manifest, TOML reading (``tomlio``) and checking (``schema``), the boards' and
formats' facts (``targets``), the workspace layout, the quiet terminal. The four stages are its subpackages
``edgemask.trainer``, ``edgemask.export``, ``edgemask.devices`` and ``edgemask.profiling`` (folders ``trainer/``, …
at the repository's top, mapped by ``setup.py``); the command line and the demo that drive them are
``edgemask.cli`` (the top). Imports go one way: cli -> stages -> the ground (``tests/test_architecture.py``).
"""

__version__ = "0.1.0"
