"""What one rank runs on: its context (rank, world, phases), its memory ledger, the caching
allocator model and its traces, the independent storage observer, the op counter and the meta
kernel cache (the dispatch modes)."""
