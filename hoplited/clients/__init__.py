"""Local clients: the Unix-socket listener and one session per connected process."""
