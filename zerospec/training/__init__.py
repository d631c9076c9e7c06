"""One training run, composed: its configuration and the sections owned by its features, the
per-rank step, the runs on threads or processes, checkpoints and resuming, paper-scale
measurement on meta tensors and the fit searches over them."""
