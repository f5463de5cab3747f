"""The HTTP edge: the application, signaling (/offer, WHIP), auth, rate limits, guards, the session
registry.
"""
