"""The agents: Planner, Coder and the Verifier agent's routing, over any LLM; the optimize loop."""
