"""Realtime avatar/voice session server: transport, session runtime, scheduler.

This package knows no particular model; model backends live in ``models``.
"""

__version__ = "0.1.0"
