"""Packaging: one installed name. The repository keeps one folder per stage at its top (trainer/, export/, devices/,
profiling/, cli/ beside the ground, edgemask/), and installs each as a subpackage of ``edgemask``
(``edgemask.trainer``, …): a user's environment gets one top-level name, ``edgemask`` (docs/architecture.md,
"One installed name"). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

STAGES = ("trainer", "export", "devices", "profiling", "cli")  # folder -> edgemask.<folder>

setup(
    packages=["edgemask"] + [f"edgemask.{p}" for p in find_packages(include=[f"{s}*" for s in STAGES])],
    package_dir={"edgemask": "edgemask", **{f"edgemask.{s}": s for s in STAGES}},
)
