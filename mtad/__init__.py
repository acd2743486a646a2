"""MTAD harness: multi-token joint decoding with an auxiliary model (Qin et al., ICLR 2025)."""

__version__ = "0.1.0"
