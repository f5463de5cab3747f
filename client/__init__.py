"""The command-line client: a WebRTC peer that talks to the avatar server (reference code for
integrators).
"""
