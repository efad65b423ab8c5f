"""The test fleet: stand-in devices in network namespaces (see standin.py), and their tests."""
