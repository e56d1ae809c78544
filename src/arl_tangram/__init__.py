"""ARL-Tangram: action-level external-resource management for agentic RL."""

__version__ = "0.1.0"
