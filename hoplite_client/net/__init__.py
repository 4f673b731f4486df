"""Connections (layer 2): asyncio adapters over the wire codec, shared by daemon and client."""
