"""This host's memory: the shared arena and the objects in it."""
