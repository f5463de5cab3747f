"""The wire: the client events' dialects (native and OpenAI Realtime GA), parsed in and
translated out, the commands they carry, and the link a conversation's events travel on."""
