"""The shard contract: format, reader, writer, exports (no Beam)."""
