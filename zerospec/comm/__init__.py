"""Interconnect protocol, its backends, and the ledger that counts every byte."""
from .interconnect import Call, Interconnect, REDUCE_OPS
from .ledger import CommLedger, CommRecord, ring_elements

__all__ = ["Call", "Interconnect", "REDUCE_OPS", "CommLedger", "CommRecord", "ring_elements"]
