"""Unit tests: no processes, no sockets (tests/unit/conftest.py enforces it); see tests/README.md."""
