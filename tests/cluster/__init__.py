"""Cluster tests: real processes and sockets."""
