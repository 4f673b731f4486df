"""Connections (layer 2): asyncio adapters over the wire codec, shared by the daemon and the client."""
