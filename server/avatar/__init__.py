"""The avatar: the renderer seam, what the face does at media time t, lip-sync, the video source."""
