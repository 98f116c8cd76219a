"""Unit tests: one piece in this process."""
