"""Who owns a session: the SHA-256 digest of the bearer token that created it (see auth.py),
or ``NO_OWNER`` while authentication is off. The runtime and the pipeline use the owner as a
scope (the prefix cache's salt, the per-client limits) without knowing how it was proven."""

from __future__ import annotations

NO_OWNER = ""  # the owner of sessions created while authentication is off
