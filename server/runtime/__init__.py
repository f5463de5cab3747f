"""The session runtime: the turn state machine, chunks and epochs, history, playback, events. Pure:
no I/O, no models, no WebRTC.
"""
