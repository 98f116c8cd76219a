"""Cluster tests: real processes and sockets, network namespaces where the machine allows; see tests/README.md."""
