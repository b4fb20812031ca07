"""p2pfl: asynchronous peer-to-peer federated learning with influence-based aggregation."""

__version__ = "0.1.0"
