"""The LLM-free Planner and Coder: a whole CUDA program stitched from the PyTorch graph (work in progress)."""
