"""The WebRTC transport: the peer connection, its tracks, ICE, the events channel protocol, aiortc
settings.
"""
