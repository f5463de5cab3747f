"""Model backends (ASR, LLM, TTS, avatar, vision) behind small Protocols.

This package knows nothing of WebRTC or sessions. Backends land with the voice-pipeline issue.
"""
