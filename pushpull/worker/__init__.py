"""Worker layer: tensor table (name -> key, partitions), the priority + credit
scheduler, and the engine that moves partitions through push and pull on the
communication thread (ps-lite's KVWorker, BytePS's core loops)."""
