"""edgemask: train personalized sparse models federatedly, compact them, profile them on edge boards.

The four stages live in the top-level packages ``trainer``, ``export``, ``devices`` and ``profiling``;
this package holds the command line, the workspace layout and the few pieces every stage shares
(errors, registries, atomic file writes, the artifact manifest).
"""

__version__ = "0.1.0"
