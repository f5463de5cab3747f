"""The reply pipeline: the engine seams, the voice pipeline, the turn detector, the CPU plan,
calibration and the composition root.
"""
