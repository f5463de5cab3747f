"""Several worker processes behind one port: the supervisor and its router."""
