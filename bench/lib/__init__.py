"""The bench's library: what its sections and drivers share. It imports nothing of bench/ outside
this folder (test/lib/devbroker.py is a library too)."""
