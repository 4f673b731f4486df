"""hoplited: the per-host daemon, object store and directory shard of a hoplite cluster."""
