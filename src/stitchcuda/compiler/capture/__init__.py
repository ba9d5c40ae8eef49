"""Stage 1, capture: the reference's forward as a core-ATen graph (graph.py: torch.export in the
model's own mode, decompositions, lifted constants, random draws and state), and its text for
the Planner (describe.py)."""
