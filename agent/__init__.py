"""laplace: a terminal chat agent for indefinitely long sessions on fixed-state GLA models."""

__version__ = "0.1.0"
