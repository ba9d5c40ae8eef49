"""Training the Coder: skill datasets from trajectories, GRPO + LoRA with verified rewards."""
