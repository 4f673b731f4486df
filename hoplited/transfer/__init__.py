"""The data plane: pulling objects into the store and streaming them to others."""
