"""The papers' own numbers and closed forms, each with its claim id: ZeRO's theory (memory,
communication, the printed tables), ZeRO-Infinity's, the estimators of other tools, the
evaluation's printed rows and the spec-sheet machines. Nothing here runs a model."""
