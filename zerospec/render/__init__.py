"""zerospec.render: the one table renderer (Markdown, JSON, CSV), figure set-up and saving, and the
table builders that the spec's snapshots and the command line share."""
