"""zerospec.evaluation: the paper's §10 in simulation: Table 3's configurations, the appendix's runs as
meta steps timed on a spec-sheet machine, memory through the caching allocator model, the
reproduced tables and figures.

The figures and tables reproduced are named here, without torch, for the command line's options
(the modules that build them import torch)."""

FIGURES = (2, 3, 4, 6, 7, 8)   # :mod:`.tables` builds each; :mod:`.plots` draws it
TABLES = (3,)
