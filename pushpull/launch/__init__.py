"""The launcher: ``pushpull launch`` / ``bpslaunch``."""
