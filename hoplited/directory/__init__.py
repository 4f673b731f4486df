"""The object directory: this node's shard of who holds what."""
