"""Where the ranks run: N virtual GPUs as threads with a baton (:mod:`.threads`), N real
processes on torch.distributed (:mod:`.processes`), and work beside a run in a second process
(:mod:`.helper`)."""
