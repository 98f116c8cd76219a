"""Server layer: owns a shard of keys, sums the pushes of each round and answers
pulls when the round is complete (ps-lite's KVServer, BytePS's server)."""
