"""StitchCUDA: turn a PyTorch program into a faster, verified end-to-end CUDA program."""

__version__ = "0.1.0"
